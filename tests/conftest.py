"""Test tiers and the real services.

- ``tests/unit``: no services.
- ``tests/integration``: the real RabbitMQ and PostgreSQL. Skipped on a machine without them,
  but a missing service FAILS the run when ``CI=true`` or ``MGRPO_REQUIRE_SERVICES=1``.
- ``tests/e2e``: whole-system runs.
- ``tests/deploy_live``: the compose stack built and run on a Docker engine it starts
  (root on Linux; skipped elsewhere with the reason, failed under ``CI=true``).

Fixtures ``postgres_url`` and ``rabbitmq_url`` give a reachable service or skip/fail as above.
Override the addresses with ``MGRPO_TEST_DATABASE_URL`` and ``MGRPO_TEST_BROKER_URL``.
"""

from __future__ import annotations

import os
import socket
import uuid
from urllib.parse import urlparse

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"


def services_required() -> bool:
    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("MGRPO_REQUIRE_SERVICES", "") == "1")


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url.replace("+psycopg", ""))
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1",
                                       parsed.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def _need(name: str, url: str, port: int) -> str:
    if _reachable(url, port):
        return url
    message = f"{name} is not reachable at {url}"
    if services_required():
        pytest.fail(f"{message} (CI=true / MGRPO_REQUIRE_SERVICES=1: required services "
                    "must be up; start them, see .ci/run)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return _need("PostgreSQL",
                 os.environ.get("MGRPO_TEST_DATABASE_URL", DEFAULT_DATABASE_URL), 5432)


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    return _need("RabbitMQ",
                 os.environ.get("MGRPO_TEST_BROKER_URL", DEFAULT_BROKER_URL), 5672)


@pytest.fixture
def unique_name() -> str:
    """A name no other test (or earlier run) uses: for queues, schemas, run ids."""
    return f"t{uuid.uuid4().hex[:10]}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath)
        if "/tests/integration/" in path:
            item.add_marker(pytest.mark.integration)
        if "/tests/e2e/" in path:
            item.add_marker(pytest.mark.e2e)
        if "gpu" in item.keywords:
            try:
                import torch

                has_gpu = torch.cuda.is_available()
            except ImportError:  # pragma: no cover
                has_gpu = False
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
