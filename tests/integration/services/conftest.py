"""Fixtures: a fresh PostgreSQL database, unique queue names, tiny models and a benchmark, and
a launcher that runs each service as its own process (``python -m mgrpo.cli.main serve ...``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from queues_cleanup import delete_run_queues

from mgrpo.services.context import Queues
from mgrpo.services.launcher import ServiceProcesses
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database

KIT_DIR = Path(__file__).resolve().parents[2] / "unit" / "services"
sys.path.insert(0, str(KIT_DIR))

from services_testkit import make_bench, make_tiny, write_run_config  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity_kit import PARITY_SFT_STEPS  # noqa: E402


@pytest.fixture(scope="session")
def warm_assets():
    """Benchmark and warm-started tiny models for every parity test, built once per machine
    and code version (``mgrpo.experiments.tiny_assets.prepare_cached``: on disk, keyed by
    settings and code)."""
    from mgrpo.experiments.tiny_assets import prepare_cached

    return prepare_cached(PARITY_SFT_STEPS)


class Services(ServiceProcesses):
    """The library's launcher with test failures: ``start`` takes argv after ``serve``."""

    def start(self, name: str, *argv: str, port: int | None = None) -> subprocess.Popen:
        return super().start(name, "serve", *argv, port=port)

    def wait_healthy(self, name: str, timeout_s: float = 300.0) -> None:
        try:
            super().wait_healthy(name, timeout_s=timeout_s)
        except (RuntimeError, TimeoutError) as error:
            raise AssertionError(str(error)) from None


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    return make_tiny(root / "tiny"), make_bench(root / "bench")


@pytest.fixture
def deployment(postgres_url, rabbitmq_url, unique_name, assets, tmp_path):
    """(env, store, Services): a fresh database and queue prefix for ONE test."""
    yield from _deploy(postgres_url, rabbitmq_url, unique_name, assets, tmp_path)


@pytest.fixture
def private_deployment(private_postgres, private_rabbitmq, unique_name, assets, tmp_path):
    """Like ``deployment``, on the PRIVATE PostgreSQL and RabbitMQ (tests that restart them):
    (env, store, Services, postgres, rabbitmq)."""
    for env, store, services in _deploy(private_postgres.url, private_rabbitmq.url,
                                        unique_name, assets, tmp_path):
        yield env, store, services, private_postgres, private_rabbitmq


def _deploy(postgres_url, rabbitmq_url, unique_name, assets, tmp_path):
    tiny, bench = assets
    # A fixed run name: the database is the test's own, and the episode seeds (which mix in
    # the round id) are then the same on every run, so which sub-agents a round calls is too
    # (with a random name 1 round in 64 had no coder call). Queues still need unique names.
    cfg_path = write_run_config(tmp_path / "run.yaml", tiny, bench, name="it", k=2, queries=3)
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        env = {**os.environ, "MGRPO_MODE": "distributed", "MGRPO_DATABASE_URL": url,
               "MGRPO_BROKER_URL": rabbitmq_url, "MGRPO_RUN_CONFIG": str(cfg_path),
               "MGRPO_ENGINE": "services_testkit:scripted_engine",
               "MGRPO_QUEUE_PREFIX": f"{unique_name}.",
               "MGRPO_CHECKPOINT_URI": str(tmp_path / "ckpt"), "OMP_NUM_THREADS": "1",
               # a killed trainer's replacement takes over its model's lease within 3 s
               "MGRPO_TRAINER_LEASE_S": "3",
               "PYTHONPATH": os.pathsep.join([str(KIT_DIR), os.environ.get("PYTHONPATH", "")]),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        services = Services(env, tmp_path)
        try:
            yield env, store, services
        finally:
            services.stop_all()
            delete_run_queues(rabbitmq_url, Queues(f"{unique_name}."))
            store.close()

