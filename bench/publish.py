"""Publishing N messages to RabbitMQ: one publisher confirm each, one confirm wait per batch,
or one AMQP transaction per batch. Same messages, same broker, alternated in one run.

- ``one_by_one``: :meth:`KombuBus.publish` per message (each waits for its confirm);
- ``publish_many``: :meth:`KombuBus.publish_many` (``mgrpo.bus.confirmed_batch``: the batch
  is sent, then the broker's acks are read until all of it is confirmed);
- ``tx``: the same messages on a channel in transaction mode (``tx.select``), one
  ``tx.commit`` per batch: the fallback the confirm-based batch was measured against.

Messages: planner trajectory messages (``--tokens`` tokens each, ~8 KB of JSON at 300),
persistent, to a durable work queue that is emptied between repeats. Timed: the publish call
only (serialisation included). The load average is recorded before and after.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/publish.py [--sizes 24 64] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import uuid
from pathlib import Path

from kombu import Connection, Producer

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import TrajectoryMessage
from mgrpo.bus.topology import WORK_EXCHANGE
from mgrpo.bus.transport import to_wire
from mgrpo.types import Trajectory

RESULT_FILE = Path(__file__).resolve().parent / "results" / "publish.json"


def trajectory(i: int, tokens: int, rng: random.Random) -> TrajectoryMessage:
    return TrajectoryMessage(trajectory=Trajectory(
        traj_id=f"bench/{uuid.uuid4().hex}/{i}", round_id="bench", query_id=f"q{i}",
        rollout=i % 4, agent="planner", model="planner",
        input_ids=[rng.randrange(600) for _ in range(tokens)], response_mask=[1] * tokens,
        old_logprobs=[-rng.random() for _ in range(tokens)]))


class TxPublisher:
    """The batch in one AMQP transaction on its own channel."""

    def __init__(self, url: str, bus: KombuBus) -> None:
        self.connection = Connection(url)
        self.channel = self.connection.channel()
        self.channel.tx_select()
        self.producer = Producer(self.channel)
        self.bus = bus

    def publish(self, queue: str, messages: list) -> None:
        declared = self.bus.work_queue(queue)
        for message in messages:
            self.producer.publish(to_wire(message), exchange=WORK_EXCHANGE,
                                  routing_key=queue, delivery_mode=2,
                                  content_type="application/json", content_encoding="utf-8",
                                  message_id=message.message_id, declare=[declared])
        self.channel.tx_commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[24, 64])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--broker-url", default=os.environ.get(
        "MGRPO_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--out", default=str(RESULT_FILE))
    args = parser.parse_args()
    prefix = f"bench-publish-{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}.work"
    bus = KombuBus(args.broker_url, dead_letter_queue_name=f"{prefix}.dlq")
    tx = TxPublisher(args.broker_url, bus)
    rng = random.Random(0)
    paths = {"one_by_one": lambda ms: [bus.publish(queue, m) for m in ms],
             "publish_many": lambda ms: bus.publish_many([(queue, m) for m in ms]),
             "tx": lambda ms: tx.publish(queue, ms)}
    load_before = os.getloadavg()
    rows = []
    try:
        with Connection(args.broker_url) as admin:
            channel = admin.channel()
            for size in args.sizes:
                times: dict[str, list[float]] = {name: [] for name in paths}
                for repeat in range(args.repeats + 1):  # the first is a warm-up
                    for name, publish in paths.items():  # alternated
                        messages = [trajectory(i, args.tokens, rng) for i in range(size)]
                        started = time.perf_counter()
                        publish(messages)
                        if repeat:
                            times[name].append(time.perf_counter() - started)
                        channel.queue_purge(queue)
                medians = {name: statistics.median(t) for name, t in times.items()}
                rows.append({
                    "messages": size, "repeats": args.repeats,
                    "median_ms": {n: round(v * 1000, 2) for n, v in medians.items()},
                    "quartiles_ms": {n: [round(q * 1000, 2) for q in
                                         statistics.quantiles(t, n=4)[::2]]
                                     for n, t in times.items()},
                    "one_by_one_over_publish_many": round(
                        medians["one_by_one"] / medians["publish_many"], 2),
                    "tx_over_publish_many": round(medians["tx"] / medians["publish_many"], 2)})
                print(json.dumps(rows[-1]), flush=True)
            channel.queue_delete(queue)
            channel.queue_delete(f"{prefix}.dlq")
    finally:
        tx.connection.release()
        bus.close()
    result = {"tokens_per_message": args.tokens,
              "bytes_per_message": len(to_wire(trajectory(0, args.tokens, rng))),
              "rows": rows, "load_avg_before": [round(x, 2) for x in load_before],
              "load_avg_after": [round(x, 2) for x in os.getloadavg()],
              "cpu_count": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
