"""Store checks run on SQLite (tests/unit/store) AND on PostgreSQL (tests/integration/store):
a plain module, imported by both (conftest files are not importable)."""

from __future__ import annotations

import pytest

from mgrpo.store import Store


def checkpoint_contract(store, model: str) -> None:
    """Issue 16 item 4: a conflicting sha256 (or uri) for a recorded (run, model, version)
    used to be dropped silently (the first kept, the files rewritten); now it raises. The
    same version number in another run is another checkpoint."""
    from mgrpo.store.registry import CheckpointConflict

    assert store.record_checkpoint(model, 1, "file:///ck/eco/v1", "a" * 64, run_id="eco")
    with pytest.raises(CheckpointConflict, match="already recorded"):
        store.record_checkpoint(model, 1, "file:///ck/eco/v1", "b" * 64, run_id="eco")
    with pytest.raises(CheckpointConflict, match="already recorded"):
        store.record_checkpoint(model, 1, "file:///ck/elsewhere", "a" * 64, run_id="eco")
    assert store.record_checkpoint(model, 1, "file:///ck/other/v1", "b" * 64, run_id="other")
    assert store.latest_checkpoint(model, run_id="eco").sha256 == "a" * 64
    assert store.latest_checkpoint(model, run_id="other").sha256 == "b" * 64
    assert store.latest_checkpoint(model, run_id="nobody") is None
    assert [(c.run_id, c.version) for c in store.list_checkpoints(model)] == [
        ("eco", 1), ("other", 1)]
    assert [c.uri for c in store.list_checkpoints(model, run_id="other")] == [
        "file:///ck/other/v1"]


def migration_0002_contract(url: str) -> None:
    """A checkpoint recorded before 0002 (global versions) gets the run of its round."""
    from sqlalchemy import create_engine, text

    from mgrpo.store.migrate import upgrade

    upgrade(url, "0001")
    engine = create_engine(url)
    with engine.begin() as db:
        db.execute(text("INSERT INTO runs (run_id, name, status, config, created_at) "
                        "VALUES ('eco', 'eco', 'done', '{}', CURRENT_TIMESTAMP)"))
        db.execute(text("INSERT INTO rounds (round_id, run_id, index, k, status, config, "
                        "created_at) VALUES ('eco-r0000', 'eco', 0, 2, 'done', '{}', "
                        "CURRENT_TIMESTAMP)".replace(" index,", ' "index",')))
        for version, round_id in ((1, "'eco-r0000'"), (2, "NULL")):
            db.execute(text(f"INSERT INTO checkpoints (model, version, uri, sha256, round_id, "
                            f"created_at) VALUES ('planner', {version}, 'u{version}', "
                            f"'{'a' * 64}', {round_id}, CURRENT_TIMESTAMP)"))
    engine.dispose()
    store = Store(url)
    store.upgrade()
    assert [(c.run_id, c.version) for c in store.list_checkpoints("planner")] == [
        ("", 2), ("eco", 1)]
    assert store.record_checkpoint("planner", 1, "u-other", "b" * 64, run_id="other")
    store.close()


def lease_contract(store, name: str) -> None:
    """Issue 13: one holder at a time; the holder renews; another takes over only after the
    lease expired (a dead holder) or was released."""
    import time

    assert store.get_lease(name) is None
    assert store.acquire_lease(name, "a", ttl_s=30)
    first = store.get_lease(name)
    assert not store.acquire_lease(name, "b", ttl_s=30)  # held, unexpired: refused
    assert store.get_lease(name).holder == "a"
    assert store.acquire_lease(name, "a", ttl_s=30)  # a renewal keeps acquired_at
    renewed = store.get_lease(name)
    assert renewed.acquired_at == first.acquired_at and renewed.expires_at > first.expires_at
    assert not store.release_lease(name, "b")  # not b's to give back
    assert store.release_lease(name, "a")
    assert store.get_lease(name) is None
    assert store.acquire_lease(name, "b", ttl_s=0.3)
    assert not store.acquire_lease(name, "a", ttl_s=30)
    time.sleep(0.6)  # b died: its lease expired
    assert store.acquire_lease(name, "a", ttl_s=30)
    assert store.get_lease(name).holder == "a"
    assert not store.acquire_lease(name, "b", ttl_s=30)
    assert store.acquire_lease(f"{name}-other", "b", ttl_s=30)  # names are independent
    with pytest.raises(ValueError, match="ttl_s"):
        store.acquire_lease(name, "a", ttl_s=0)
