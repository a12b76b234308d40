"""A round command on a batch consumer's queue (a trainer's cue to check a round) is handled
at once, with whatever trajectories arrived before it, instead of after ``linger_s`` of quiet:
the linger used to sit on the distributed round's critical path (issue 15 item 1)."""

from __future__ import annotations

import threading
import time

from queues_cleanup import delete_queues
from test_bus_poison import wait_for

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import RoundCommand, TrajectoryMessage
from mgrpo.services.batching import consume_batches
from mgrpo.types import Trajectory

LINGER_S = 30.0


def trajectory(i: int) -> Trajectory:
    return Trajectory(traj_id=f"r/q{i}/0/searcher/0", round_id="r", query_id=f"q{i}",
                      rollout=0, agent="searcher", model="searcher", input_ids=[1, 2, 3],
                      response_mask=[0, 1, 1], old_logprobs=[0.0, -0.1, -0.2])


def test_a_round_command_flushes_its_batch_without_lingering(rabbitmq_url, unique_name):
    queue, dlq = f"{unique_name}.trainer.searcher", f"{unique_name}.dlq"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    batches: list[tuple[float, list[str]]] = []
    lock = threading.Lock()

    def handler(messages) -> None:
        with lock:
            batches.append((time.monotonic(), [m.kind for m in messages]))

    stop = threading.Event()
    try:
        for i in range(3):
            bus.publish(queue, TrajectoryMessage(trajectory=trajectory(i)))
        bus.publish(queue, RoundCommand(command="train", run_id="r", round_id="r",
                                        model="searcher"))
        started = time.monotonic()
        consume_batches(bus, queue, handler, consumer="trainer-searcher", batch_size=256,
                        linger_s=LINGER_S, claims=False, stop=stop)
        assert wait_for(lambda: sum(len(k) for _, k in batches) == 4, timeout_s=60)
        kinds = [kind for _, ks in batches for kind in ks]
        assert sorted(kinds) == ["round_command"] + ["trajectory"] * 3
        handled_after = batches[-1][0] - started
        # counted from before the consumer connects; far below the linger either way
        assert handled_after < LINGER_S / 3, (handled_after, batches)
    finally:
        stop.set()
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)
