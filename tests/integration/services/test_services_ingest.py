"""The trainer's batched ingestion on the real RabbitMQ and PostgreSQL: one batch holding
valid trajectories, a duplicate (the same message twice, and a re-send with a new id) and
poison messages (another model's trajectory, mismatched token arrays, a wrong kind): every
valid row is stored once, each poison message is dead-lettered with its reason, nothing stays
unacked, and the valid rows were written in one transaction (one ``INSERT`` statement)."""

from __future__ import annotations

import threading
import time

from kombu import Connection
from queues_cleanup import delete_queues
from services_testkit import make_tiny, write_run_config
from sqlalchemy import event
from waiting import wait_for

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import EpisodeTask, TrajectoryMessage
from mgrpo.config import Settings
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import Queues, load_service_config
from mgrpo.services.trainer.service import TrainerService
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.types import Trajectory

VALID = 20


def trajectory(i: int, model: str = "searcher", **update) -> Trajectory:
    traj = Trajectory(traj_id=f"r/q{i}/0/{model}/0", round_id="r", query_id=f"q{i}",
                      rollout=0, agent=model, model=model, input_ids=[1, 2, 3],
                      response_mask=[0, 1, 1], old_logprobs=[0.0, -0.1, -0.2])
    return traj.model_copy(update=update)


def queue_depth(url: str, name: str) -> tuple[int, int]:
    """(ready, consumers) of a queue, as the broker sees it."""
    with Connection(url) as connection:
        ok = connection.channel().queue_declare(name, passive=True)
        return ok.message_count, ok.consumer_count


def test_batch_with_duplicate_and_poison(postgres_url, rabbitmq_url, unique_name, tmp_path):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                tmp_path / "bench", name=unique_name)
    queues = Queues(f"{unique_name}.")
    queue = queues.trainer("searcher")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            run_config=str(cfg_path), queue_prefix=f"{unique_name}.")
        trainer = TrainerService(settings, load_service_config(settings), store, None,
                                 "searcher")
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        inserts: list[int] = []
        batches: list[int] = []

        def count_inserts(conn, cursor, statement, params, context, executemany):
            if statement.startswith("INSERT INTO trajectories"):
                inserts.append(1)

        def handler(messages):
            batches.append(len(messages))
            return trainer.handle_batch(messages)

        event.listen(store.engine, "before_cursor_execute", count_inserts)
        stop = threading.Event()
        try:
            messages = [TrajectoryMessage(trajectory=trajectory(i)) for i in range(VALID)]
            for message in messages:
                bus.publish(queue, message)
            bus.publish(queue, messages[3])  # the same message again
            bus.publish(queue, TrajectoryMessage(trajectory=trajectory(5)))  # new id, same row
            bus.publish(queue, TrajectoryMessage(trajectory=trajectory(90, model="coder")))
            bus.publish(queue, TrajectoryMessage(trajectory=trajectory(
                91, old_logprobs=[0.0])))
            bus.publish(queue, EpisodeTask(run_id="r", round_id="r", query_id="q", rollout=0))
            consume_batches(bus, queue, handler, consumer="trainer-searcher", batch_size=256,
                            linger_s=2.0, claims=False, stop=stop)  # > any delivery gap
            assert wait_for(lambda: store.count_trajectories("r") == VALID)
            letters: list = []
            assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 3)
            assert wait_for(lambda: queue_depth(rabbitmq_url, queue)[0] == 0)
            time.sleep(0.5)
            letters += bus.dead_letters()
            assert store.count_trajectories("r") == VALID
            assert store.count_trajectories("r", "coder") == 0
            reasons = sorted(letter.reason for letter in letters)
            assert len(reasons) == 3, reasons
            assert any("is of model 'coder', sent to trainer 'searcher'" in r for r in reasons)
            assert any("must have one entry per token" in r for r in reasons)
            assert any("takes trajectory and round_command messages, got 'episode_task'" in r
                       for r in reasons)
            assert all(letter.queue == queue for letter in letters)
            assert batches == [VALID + 3]  # one batch; both duplicates skipped in it
            assert len(inserts) == 1  # ... written by ONE multi-row INSERT
            bus.publish(queue, messages[0])  # a redelivery in a later batch: a no-op
            bus.publish(queue, TrajectoryMessage(trajectory=trajectory(VALID)))
            assert wait_for(lambda: store.count_trajectories("r") == VALID + 1)
            assert wait_for(lambda: queue_depth(rabbitmq_url, queue)[0] == 0)
            assert store.count_trajectories("r") == VALID + 1
            assert bus.dead_letters() == []
            stop.set()
            time.sleep(1.0)  # the consumer closes its channel: anything unacked comes back
            assert queue_depth(rabbitmq_url, queue)[0] == 0
        finally:
            stop.set()
            event.remove(store.engine, "before_cursor_execute", count_inserts)
            bus.close()
            store.close()
            delete_queues(rabbitmq_url, queue, queues.dead_letter)
