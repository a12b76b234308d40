"""A round whose creator dies between creating it and publishing its tasks (the real
PostgreSQL and RabbitMQ; the death: a ``SystemExit`` out of the publish) is left running and
unpublished; the sweep publishes its B x K episode tasks and its trainers' wake-ups once, and a
second sweep publishes nothing. A round published normally is never swept."""

from __future__ import annotations

import pytest
from kombu import Connection
from queues_cleanup import delete_run_queues
from services_testkit import make_bench

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.services.context import Queues
from mgrpo.services.rounds import publish_unpublished_rounds, start_round
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.training.config import ModelConfig, RunConfig


def _depth(url: str, queue: str) -> int:
    with Connection(url) as connection:
        return connection.channel().queue_declare(queue, passive=True).message_count


def test_a_round_left_unpublished_is_published_once_by_the_sweep(postgres_url, rabbitmq_url,
                                                                   unique_name, tmp_path,
                                                                   monkeypatch):
    cfg = RunConfig(name=unique_name, models={m: ModelConfig(path=str(tmp_path / m)) for m in
                                              ("planner", "searcher", "coder")},
                    bench_dir=str(make_bench(tmp_path / "bench")), queries_per_round=3, k=2)
    queues = Queues(f"{unique_name}.")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        try:
            for queue in (queues.episodes, queues.trainer("planner")):
                bus.declare_queue(bus.work_queue(queue))
            with monkeypatch.context() as patch:
                def killed(sends):
                    raise SystemExit("killed between creating the round and publishing")

                patch.setattr(bus, "publish_many", killed)
                with pytest.raises(SystemExit):
                    start_round(store, bus, cfg, queues, index=0)
            record = store.get_round(f"{unique_name}-r0000")
            assert record.status == "running" and not record.published
            assert _depth(rabbitmq_url, queues.episodes) == 0
            assert publish_unpublished_rounds(store, bus, queues, cfg, grace_s=3600) == []
            assert publish_unpublished_rounds(store, bus, queues, cfg, grace_s=0) == \
                [record.round_id]
            assert store.get_round(record.round_id).published
            assert _depth(rabbitmq_url, queues.episodes) == 3 * 2
            assert _depth(rabbitmq_url, queues.trainer("planner")) == 1
            assert publish_unpublished_rounds(store, bus, queues, cfg, grace_s=0) == []
            assert _depth(rabbitmq_url, queues.episodes) == 3 * 2

            store.set_round_status(record.round_id, "done")
            started = start_round(store, bus, cfg, queues, index=1)
            assert store.get_round(started.round_id).published
            assert publish_unpublished_rounds(store, bus, queues, cfg, grace_s=0) == []
            assert _depth(rabbitmq_url, queues.episodes) == 2 * 3 * 2
        finally:
            bus.close()
            store.close()
            delete_run_queues(rabbitmq_url, queues)
