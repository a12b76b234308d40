"""What a trainer refuses at ingest, on the real RabbitMQ and PostgreSQL: a token id outside
its model's vocabulary (known once the model is loaded), a trajectory longer than
``models.<m>.max_trajectory_tokens``, and a DIFFERENT trajectory under an (id, attempt) that is
stored already (in a later batch or in the same one): each is a dead letter with its reason, the
stored trajectory stays as it was, and a plain redelivery of it is only acked."""

from __future__ import annotations

import threading

import yaml
from queues_cleanup import delete_queues
from services_testkit import make_tiny, write_run_config
from waiting import wait_for

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import TrajectoryMessage
from mgrpo.config import Settings
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import Queues, load_service_config
from mgrpo.services.trainer.service import TrainerService
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.types import Trajectory

VOCAB = 400  # make_tiny's vocabulary


def trajectory(i: int, ids: list[int] | None = None, attempt: int = 0) -> Trajectory:
    ids = ids if ids is not None else [1, 2, 3]
    return Trajectory(traj_id=f"r/q{i}/0/planner/0", attempt=attempt, round_id="r",
                      query_id=f"q{i}", rollout=0, agent="planner", model="planner",
                      input_ids=ids, response_mask=[0] + [1] * (len(ids) - 1),
                      old_logprobs=[0.0] + [-0.5] * (len(ids) - 1))


def test_trainer_refuses_hostile_trajectories(postgres_url, rabbitmq_url, unique_name,
                                              tmp_path):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                tmp_path / "bench", name=unique_name)
    config = yaml.safe_load(cfg_path.read_text())
    config["models"]["planner"]["max_trajectory_tokens"] = 16
    cfg_path.write_text(yaml.safe_dump(config))
    queues = Queues(f"{unique_name}.")
    queue = queues.trainer("planner")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            run_config=str(cfg_path), queue_prefix=f"{unique_name}.",
                            device="cpu")
        trainer = TrainerService(settings, load_service_config(settings), store, None,
                                 "planner")
        trainer.load()
        assert trainer.ingest.vocab_size == VOCAB
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        stop = threading.Event()
        try:
            real = trajectory(0)
            bus.publish(queue, TrajectoryMessage(trajectory=real))
            consume_batches(bus, queue, trainer.handle_batch, consumer="trainer-planner",
                            batch_size=64, linger_s=0.3, claims=False, stop=stop)
            assert wait_for(lambda: store.count_trajectories("r") == 1, 30)
            for message in [
                    TrajectoryMessage(trajectory=real),  # a redelivery: acked, nothing more
                    TrajectoryMessage(trajectory=trajectory(1, [1, 10**9, 3])),
                    TrajectoryMessage(trajectory=trajectory(2, [1, -1])),
                    TrajectoryMessage(trajectory=trajectory(3, list(range(1, 18)))),
                    TrajectoryMessage(trajectory=trajectory(0, [1, 7, 7, 7])),  # same key
                    TrajectoryMessage(trajectory=trajectory(4, [1, 2]), message_id="a"),
                    TrajectoryMessage(trajectory=trajectory(4, [1, 2, 3, 4]),
                                      idempotency_key="other")]:  # same key, one batch
                bus.publish(queue, message)
            letters: list = []
            assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 5,
                            30), letters
            reasons = sorted(letter.reason for letter in letters)
            assert len(reasons) == 5, reasons
            assert sum("outside the vocabulary of planner (0..399)" in r for r in reasons) == 2
            assert sum("17 tokens, over models.planner.max_trajectory_tokens (16)" in r
                       for r in reasons) == 1
            assert sum("another trajectory is stored as" in r for r in reasons) == 2, reasons
            assert store.count_trajectories("r") == 2  # q0 (the real one) and q4's first
            stored = {t.query_id: t.input_ids
                      for t in store_trajectories(store, url)}
            assert stored == {"q0": [1, 2, 3], "q4": [1, 2]}
        finally:
            stop.set()
            bus.close()
            store.close()
            delete_queues(rabbitmq_url, queue, queues.dead_letter)


def store_trajectories(store, url) -> list[Trajectory]:
    from sqlalchemy import select

    from mgrpo.store.models import TrajectoryRow

    with store.engine.connect() as connection:
        rows = connection.execute(select(TrajectoryRow.query_id, TrajectoryRow.payload)).all()
    return [Trajectory(traj_id="x", round_id="r", query_id=q, rollout=0, agent="planner",
                       model="planner", input_ids=p["input_ids"],
                       response_mask=p["response_mask"], old_logprobs=p["old_logprobs"])
            for q, p in rows]
