"""A PostgreSQL restart (a PRIVATE cluster, never the shared one) while consumers write to it:
a database error is an infrastructure failure, so the messages are requeued and handled once
the database is back; none is dead-lettered, none is lost, none is stored twice. Both consumer
kinds: one-message (trainer ingestion) and batch (workers), with the duplicate check and the
claims on that same database."""

from __future__ import annotations

import threading
import time

from kombu import Connection

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import TrajectoryMessage
from mgrpo.services import batching
from mgrpo.services.batching import consume_batches
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.types import Trajectory

N = 12


def trajectory(i: int, model: str) -> Trajectory:
    return Trajectory(traj_id=f"r/q{i}/0/{model}/0", round_id="r", query_id=f"q{i}", rollout=0,
                      agent=model, model=model, input_ids=[1, 2, 3],
                      response_mask=[0, 1, 1], old_logprobs=[0.0, -0.1, -0.2])


def wait_for(predicate, timeout_s: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001 - the database may be down right now
            pass
        time.sleep(0.2)
    return predicate()


def test_database_restart_requeues_instead_of_dead_lettering(private_postgres, rabbitmq_url,
                                                            unique_name, monkeypatch):
    monkeypatch.setattr(batching, "RETRY_DELAY_S", 0.5)
    single, batch, dlq = (f"{unique_name}.trainer.planner", f"{unique_name}.trainer.searcher",
                          f"{unique_name}.dlq")
    with temporary_database(private_postgres.url) as url:
        store = Store(url)
        store.upgrade()
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=dlq)
        handled = threading.Semaphore(0)

        def ingest(message) -> None:
            time.sleep(0.1)  # slow enough that the restart lands mid-stream
            store.ingest_trajectory(message.trajectory)
            handled.release()

        def ingest_batch(messages) -> None:
            time.sleep(0.1)
            store.ingest_trajectories([m.trajectory for m in messages])
            handled.release()

        stop = threading.Event()
        try:
            bus.consume(single, ingest, consumer="trainer-planner")
            consume_batches(bus, batch, ingest_batch, consumer="trainer-searcher",
                            batch_size=3, linger_s=0.1, stop=stop)
            for i in range(N):
                bus.publish(single, TrajectoryMessage(trajectory=trajectory(i, "planner")))
                bus.publish(batch, TrajectoryMessage(trajectory=trajectory(i, "searcher")))
            assert handled.acquire(timeout=60)  # some are in; restart mid-stream
            private_postgres.restart(down_s=3.0)
            assert wait_for(lambda: store.count_trajectories("r", "planner") == N
                            and store.count_trajectories("r", "searcher") == N), \
                (store.count_trajectories("r", "planner"),
                 store.count_trajectories("r", "searcher"), bus.peek_dead_letters())
            time.sleep(1.0)
            assert bus.dead_letters() == []
            assert store.count_trajectories("r") == 2 * N  # nothing twice
            assert bus.consumer_problems() == []
        finally:
            stop.set()
            bus.close()
            store.close()
            with Connection(rabbitmq_url) as connection:
                channel = connection.channel()
                for name in (single, batch, dlq):
                    try:
                        channel.queue_delete(name)
                    except Exception:  # noqa: BLE001 - already gone
                        channel = connection.channel()
