"""Two dead-letter replays at once on the real RabbitMQ: they take turns (a lock on the
broker), so neither replays a letter twice and each accounts for every letter it read
(replayed + kept = read = what the queue held when its pass began). Before, the two passes
interleaved: one replayed letters that the other's replays had sent back, and the letters one
held unacked (kept) were missing from the other's report.

The source queue's consumer dead-letters every message again (the cause is not fixed), so a
replayed letter comes straight back while a replay may still be reading. Each replayed
publish is slowed by 20 ms so that two passes started together overlap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from queues_cleanup import delete_queues
from waiting import wait_for

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import RoundCommand

LETTERS, OTHERS = 20, 3


def test_two_replays_at_once_take_turns_and_account_for_every_letter(rabbitmq_url,
                                                                      unique_name,
                                                                      monkeypatch):
    prefix = f"{unique_name}."
    queue, other = f"{prefix}subagent.coder", f"{prefix}subagent.searcher"
    dlq = f"{prefix}mgrpo.dead_letter"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)

    def still_broken(message) -> None:
        raise LookupError(f"round {message.round_id!r} is not in the store")

    try:
        bus.consume(queue, still_broken, consumer="subagent-coder")
        for i in range(LETTERS):
            bus.publish(queue, RoundCommand(command="train", run_id="r", round_id=f"c{i}"))
        for i in range(OTHERS):  # from a queue the replay leaves alone: kept
            bus.dead_letter(other, json.dumps({"kind": "x", "n": i}), "kept on purpose")
        assert wait_for(lambda: len(bus.peek_dead_letters()) == LETTERS + OTHERS)

        publish = KombuBus.publish_raw

        def slow_publish(self, target: str, body: str, **options) -> None:
            time.sleep(0.02)
            publish(self, target, body, **options)

        monkeypatch.setattr(KombuBus, "publish_raw", slow_publish)
        together = threading.Barrier(2)

        def replay(_: int):
            replayer = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
            try:
                together.wait()
                return replayer.replay_report(source=queue)
            finally:
                replayer.close()

        with ThreadPoolExecutor(2) as pool:
            reports = list(pool.map(replay, range(2)))
        for replayed, kept, at_start in reports:
            bodies = [letter.body for letter in replayed]
            assert len(bodies) == len(set(bodies)), "a letter replayed twice in one pass"
            assert sorted(json.loads(k.body)["n"] for k in kept) == list(range(OTHERS)), kept
            assert len(replayed) + len(kept) == at_start
        # the first pass replays all of them; the second those back before it began
        assert max(len(replayed) for replayed, _, _ in reports) == LETTERS
        monkeypatch.undo()

        # the CLI's account of a pass: replayed + kept = read = in the queue at the start
        assert wait_for(lambda: len(bus.peek_dead_letters()) == LETTERS + OTHERS)
        run = subprocess.run(
            [sys.executable, "-m", "mgrpo.cli.main", "dlq", "replay", "--queue", queue],
            env={**os.environ, "MGRPO_BROKER_URL": rabbitmq_url, "MGRPO_QUEUE_PREFIX": prefix},
            capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        actions = [json.loads(line)["action"] for line in run.stdout.splitlines()]
        assert actions.count("replayed") == LETTERS and actions.count("kept") == OTHERS
        account = re.search(r"replayed (\d+) dead letter\(s\), kept (\d+) .* of (\d+) read; "
                            r"(\d+) were in", run.stderr)
        assert account and account.groups() == (str(LETTERS), str(OTHERS),
                                                 str(LETTERS + OTHERS),
                                                 str(LETTERS + OTHERS)), run.stderr
    finally:
        bus.close()
        delete_queues(rabbitmq_url, queue, other, dlq, f"{dlq}.lock")
