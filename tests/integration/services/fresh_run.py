"""A fresh distributed run for the tests that build services in their own process on the real
PostgreSQL and RabbitMQ: a run config (three models from one tiny folder, a benchmark, K=2)
under the test's folder, a database and a queue prefix of its own, and the distributed
Settings of the scripted policy. On exit the run's queues are deleted and the store closes:
close the buses and stop the workers on it before."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from queues_cleanup import delete_run_queues
from services_testkit import make_bench, make_tiny, write_run_config

from mgrpo.config import Settings
from mgrpo.services.context import Queues, load_service_config
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database


@dataclass
class FreshRun:
    settings: Settings
    cfg: object  # the run config, as the services load it
    store: Store
    queues: Queues


@contextlib.contextmanager
def fresh_run(postgres_url: str, rabbitmq_url: str, root: Path, name: str, *,
              queries: int = 3, **settings) -> Iterator[FreshRun]:
    """The run named ``name`` (``queries`` per round, K=2) under ``root``; ``settings``
    override or add Settings fields (``handler_deadline_s``, ``api_token``, ...)."""
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), name=name, k=2, queries=queries)
    queues = Queues(f"t{uuid.uuid4().hex[:10]}.")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        run_settings = Settings(**{
            "mode": "distributed", "database_url": url, "broker_url": rabbitmq_url,
            "run_config": str(cfg_path), "queue_prefix": queues.prefix,
            "checkpoint_uri": str(root / "ck"), "engine": "services_testkit:scripted_engine",
            **settings})
        try:
            yield FreshRun(run_settings, load_service_config(run_settings), store, queues)
        finally:
            delete_run_queues(rabbitmq_url, queues)
            store.close()
