"""Ingest throughput: trajectory messages/s from RabbitMQ into PostgreSQL through the
trainer's ingest path (``TrainerService.handle_batch`` under ``consume_batches``: a prefetch
window, one multi-row ``INSERT ... ON CONFLICT DO NOTHING`` per batch, acks after commit).

The queue is filled first (``--messages`` trajectories of ``--tokens`` tokens each), then
the consumer starts; the time runs from its start until every row is in the database AND
the queue is empty (all acked). ``--compare`` also times the one-message path this replaced
(prefetch 1: duplicate check, insert and claim, three transactions per message) on
``--compare-messages`` messages, in the same run (batched, one-by-one, batched again).
Writes JSON to stdout and bench/results/ingest.json with the load average before and after
(a busy machine lowers both numbers). Uses a fresh database on MGRPO_DATABASE_URL's server
and a queue prefix of its own, removed afterwards.

    python bench/ingest.py [--messages 5000] [--tokens 256] [--compare]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
import uuid
from pathlib import Path

from kombu import Connection

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import TrajectoryMessage
from mgrpo.config import Settings
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import Queues
from mgrpo.services.trainer.ingest import INGEST_BATCH, INGEST_LINGER_S
from mgrpo.services.trainer.service import TrainerService
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.training.config import RunConfig
from mgrpo.types import Trajectory

MODEL = "searcher"


def trajectory(run: str, i: int, tokens: int) -> Trajectory:
    return Trajectory(traj_id=f"{run}/q{i}/0/{MODEL}/0", round_id=run, query_id=f"q{i}",
                      rollout=0, agent=MODEL, model=MODEL, input_ids=[7] * tokens,
                      response_mask=[0] * (tokens // 2) + [1] * (tokens - tokens // 2),
                      old_logprobs=[-0.5] * tokens)


def queue_depth(channel, name: str) -> int:
    return channel.queue_declare(name, passive=True).message_count


def fill(bus: KombuBus, queue: str, run: str, n: int, tokens: int) -> None:
    for i in range(n):
        bus.publish(queue, TrajectoryMessage(trajectory=trajectory(run, i, tokens)))


def time_ingest(store, bus, broker_url: str, trainer: TrainerService, queue: str, run: str,
                n: int, tokens: int, batched: bool) -> dict:
    fill(bus, queue, run, n, tokens)
    stop = threading.Event()
    start = time.perf_counter()
    if batched:
        consume_batches(bus, queue, trainer.handle_batch, consumer=f"trainer-{MODEL}",
                        batch_size=INGEST_BATCH, linger_s=INGEST_LINGER_S, claims=False,
                        stop=stop)
    else:  # the path this replaced: prefetch 1, dedupe + insert + claim per message
        bus.consume(queue, trainer.handle, consumer=f"trainer-{MODEL}-{run}")
    with Connection(broker_url) as connection:
        channel = connection.channel()
        while store.count_trajectories(run) < n or queue_depth(channel, queue) > 0:
            time.sleep(0.02)
    wall = time.perf_counter() - start
    stop.set()
    return {"path": "batched" if batched else "one_by_one", "messages": n,
            "tokens_per_trajectory": tokens, "seconds": round(wall, 3),
            "messages_per_s": round(n / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--compare-messages", type=int, default=500)
    parser.add_argument("--out", default="bench/results/ingest.json")
    args = parser.parse_args()
    settings = Settings()
    broker = settings.broker_url
    prefix = f"bench-ingest-{uuid.uuid4().hex[:8]}."
    queues = Queues(prefix)
    cfg = RunConfig.model_validate({"name": "bench", "agents": {"planner": "planner",
                                                                MODEL: MODEL},
                                    "models": {"planner": {"path": "-"},
                                               MODEL: {"path": "-"}}})
    load_before = os.getloadavg()
    rows = []
    with temporary_database(settings.database_url) as url:
        store = Store(url)
        store.upgrade()
        bus = KombuBus(broker, store, dead_letter_queue_name=queues.dead_letter)
        trainer = TrainerService(settings, cfg, store, None, MODEL)
        try:
            plan = [("b1", args.messages, True)]
            if args.compare:
                plan += [("s1", args.compare_messages, False), ("b2", args.messages, True)]
            for run, n, batched in plan:
                queue = queues.trainer(f"{MODEL}-{run}")
                rows.append(time_ingest(store, bus, broker, trainer, queue, run, n,
                                        args.tokens, batched))
                print(json.dumps(rows[-1]), flush=True)
            assert bus.peek_dead_letters() == [], "a bench message was dead-lettered"
        finally:
            bus.close()
            store.close()
            with Connection(broker) as connection:
                channel = connection.channel()
                for name in [queues.trainer(f"{MODEL}-{r}") for r in ("b1", "s1", "b2")] + [
                        queues.dead_letter]:
                    try:
                        channel.queue_delete(name)
                    except Exception:  # noqa: BLE001 - never declared
                        channel = connection.channel()
    result = {"bench": "ingest", "host": platform.node(), "cpus": os.cpu_count(),
              "prefetch": INGEST_BATCH, "linger_s": INGEST_LINGER_S,
              "load_before": [round(x, 2) for x in load_before],
              "load_after": [round(x, 2) for x in os.getloadavg()],
              "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
