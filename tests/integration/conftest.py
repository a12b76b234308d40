"""Fixtures of the integration tier: PRIVATE RabbitMQ and PostgreSQL instances (session-scoped,
removed afterwards) for the tests that restart a broker or a database; the shared ones on
5672/5432 are never restarted. Without the binaries these skip, but FAIL under ``CI=true`` /
``MGRPO_REQUIRE_SERVICES=1`` like the shared services do (``tests/conftest.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from private_services import PrivatePostgres, PrivateRabbitMQ  # noqa: E402


def services_required() -> bool:  # the same rule as tests/conftest.py
    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("MGRPO_REQUIRE_SERVICES", "") == "1")


def _start(kind, name: str):
    try:
        return kind()
    except Exception as error:  # noqa: BLE001 - reported as a skip or a failure below
        message = f"cannot start a private {name} for restart tests: {error}"
        if services_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def private_rabbitmq():
    """A RabbitMQ node of our own: ``.url``, ``.stop_app()``, ``.start_app()``."""
    broker = _start(PrivateRabbitMQ, "RabbitMQ")
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def private_postgres():
    """A PostgreSQL cluster of our own: ``.url``, ``.stop()``, ``.start()``, ``.restart()``."""
    database = _start(PrivatePostgres, "PostgreSQL")
    yield database
    database.close()
