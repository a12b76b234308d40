"""Poison messages on the real RabbitMQ and PostgreSQL: a wrong-kind message in a batch goes to
the dead-letter queue ALONE (its 8 valid neighbours are handled); a trajectory whose traj_id
holds a NUL byte is refused as malformed before the duplicate check touches the database, and
the consumer goes on consuming; ``dlq list``/``replay`` put a dead letter back to work."""

from __future__ import annotations

import json
import threading
import time

from queues_cleanup import delete_queues
from waiting import wait_for

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import EpisodeTask, RoundCommand, TrajectoryMessage, encode_message
from mgrpo.services.batching import consume_batches
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.types import Trajectory


def test_one_wrong_kind_message_does_not_take_its_batch(rabbitmq_url, unique_name):
    queue, dlq = f"{unique_name}.planner.episodes", f"{unique_name}.dlq"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    handled: list[str] = []
    lock = threading.Lock()

    def handler(messages) -> None:  # what the planner worker does with a wrong kind
        for message in messages:
            if not isinstance(message, EpisodeTask):
                raise TypeError(f"planner.episodes takes episode_task messages, got "
                                f"{message.kind!r}")
        with lock:
            handled.extend(m.query_id for m in messages)

    stop = threading.Event()
    try:
        # the wrong kind first, then 8 valid tasks: all 9 arrive in one batch of 16
        bus.publish(queue, RoundCommand(command="train", run_id="r", round_id="x"))
        for i in range(8):
            bus.publish(queue, EpisodeTask(run_id="r", round_id="x", query_id=f"q{i}",
                                           rollout=0))
        consume_batches(bus, queue, handler, consumer="planner-worker", batch_size=16,
                        linger_s=0.5, stop=stop)
        assert wait_for(lambda: len(handled) == 8), handled
        letters: list = []
        assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 1)
        time.sleep(0.5)
        letters += bus.dead_letters()
        assert sorted(handled) == [f"q{i}" for i in range(8)]
        assert len(letters) == 1
        assert json.loads(letters[0].body)["kind"] == "round_command"
        assert "TypeError" in letters[0].reason and letters[0].queue == queue
    finally:
        stop.set()
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)


def test_nul_byte_in_traj_id_is_malformed_and_the_consumer_lives(postgres_url, rabbitmq_url,
                                                                unique_name):
    queue, dlq = f"{unique_name}.trainer.planner", f"{unique_name}.dlq"
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=dlq)
        try:
            bus.consume(queue, lambda m: store.ingest_trajectory(m.trajectory),
                        consumer="trainer-planner")
            good = Trajectory(traj_id="r/q/0/planner/0", round_id="r", query_id="q",
                              rollout=0, agent="planner", model="planner", input_ids=[1, 2],
                              response_mask=[0, 1], old_logprobs=[0.0, -0.5])
            wire = encode_message(TrajectoryMessage(trajectory=good))
            wire["trajectory"]["traj_id"] = "r/q/0/plan\x00ner/0"
            wire["idempotency_key"] = "trajectory:r/q/0/plan\x00ner/0/0"
            bus.publish_raw(queue, json.dumps(wire))
            bus.publish(queue, TrajectoryMessage(trajectory=good))
            assert wait_for(lambda: store.count_trajectories("r") == 1), \
                f"the valid trajectory after the NUL one was never stored; " \
                f"consumers: {bus.consumer_problems()}"
            letters: list = []
            assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 1)
            assert len(letters) == 1 and "NUL byte" in letters[0].reason, letters
            assert letters[0].reason.startswith("undecodable message")
            assert bus.consumer_problems() == []

            # replay: a dead letter goes back to its queue (and, still bad, comes back)
            bus.publish_raw(queue, letters[0].body)
            assert wait_for(lambda: len(bus.peek_dead_letters()) == 1)
            assert len(bus.peek_dead_letters()) == 1  # peeking leaves it there
            replayed = bus.replay_dead_letters(source=queue)
            assert [r.queue for r in replayed] == [queue]
            assert wait_for(lambda: len(bus.peek_dead_letters()) == 1)  # refused again
            assert store.count_trajectories("r") == 1
        finally:
            bus.close()
            store.close()
            delete_queues(rabbitmq_url, queue, dlq)


def test_dlq_cli_lists_and_replays_once_the_cause_is_fixed(rabbitmq_url, unique_name):
    import os
    import subprocess
    import sys

    prefix = f"{unique_name}."
    queue, dlq = f"{prefix}subagent.coder", f"{prefix}mgrpo.dead_letter"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    fixed = threading.Event()
    handled: list[str] = []

    def handler(message) -> None:
        if not fixed.is_set():
            raise LookupError(f"round {message.round_id!r} is not in the store")
        handled.append(message.round_id)

    env = {**os.environ, "MGRPO_BROKER_URL": rabbitmq_url, "MGRPO_QUEUE_PREFIX": prefix}

    def mgrpo(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", "dlq", *argv], env=env,
                              capture_output=True, text=True, timeout=120)

    try:
        bus.consume(queue, handler, consumer="subagent-coder")
        bus.publish(queue, RoundCommand(command="train", run_id="r", round_id="late"))
        assert wait_for(lambda: len(bus.peek_dead_letters()) == 1)
        listed = mgrpo("list")
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["queue"], r["kind"]) for r in rows] == [(queue, "round_command")]
        assert "LookupError" in rows[0]["reason"]
        assert len(bus.peek_dead_letters()) == 1  # listing leaves it there
        fixed.set()
        replayed = mgrpo("replay")
        assert replayed.returncode == 0, replayed.stderr
        assert "replayed 1 dead letter(s)" in replayed.stderr
        assert wait_for(lambda: handled == ["late"]), handled
        assert bus.peek_dead_letters() == []
    finally:
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)
