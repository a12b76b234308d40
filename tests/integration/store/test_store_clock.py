"""Heartbeat ages on the store's clock (PostgreSQL ``now()``), not the worker's: a worker
whose clock is an hour fast must not stay "alive" for an hour after its last beat, and one
whose clock is an hour slow must not be hidden while it beats. Before, the worker stamped
``heartbeat_at`` with its own clock and the reader compared with its own."""

from __future__ import annotations

from datetime import timedelta

import pytest

import mgrpo.store.registry as registry
from mgrpo.store import Store


@pytest.mark.parametrize("skew_h", [1, -1], ids=["fast", "slow"])
def test_heartbeat_age_uses_the_store_clock(pg_store, pg_database_url, monkeypatch, skew_h):
    worker, reader = Store(pg_database_url), Store(pg_database_url)
    name = f"clock-{'fast' if skew_h > 0 else 'slow'}"
    try:
        real = registry.utcnow
        monkeypatch.setattr(registry, "utcnow", lambda: real() + timedelta(hours=skew_h))
        worker.register_agent(name, model="m", queue="q")
        worker.heartbeat(name)
        monkeypatch.setattr(registry, "utcnow", real)
        alive = {a.name for a in reader.list_agents(alive_within_s=30)}
        assert name in alive  # it beat just now, whatever its clock says
        [record] = [a for a in reader.list_agents() if a.name == name]
        stamped_skew = abs((record.heartbeat_at - real()).total_seconds())
        assert stamped_skew < 60, stamped_skew
    finally:
        worker.close()
        reader.close()
