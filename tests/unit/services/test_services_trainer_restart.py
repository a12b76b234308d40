"""A trainer restarted from its newest recorded checkpoint continues EXACTLY: same weights,
same Adam moments and step counts, so the next update equals the uninterrupted one. Real tiny
model, SQLite store, local checkpoint folder; no round is played (steps on a fixed batch)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from services_testkit import make_tiny, write_run_config

from mgrpo.config import Settings
from mgrpo.parallel.optimizer_state import OptimizerStateError, optimizer_state_uri
from mgrpo.services.context import load_service_config, open_store
from mgrpo.services.trainer.service import TrainerService

BATCH = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 3]])


@pytest.fixture
def deployment(tmp_path):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                tmp_path / "bench")
    settings = Settings(mode="embedded", database_url=f"sqlite:///{tmp_path}/store.db",
                        checkpoint_uri=str(tmp_path / "ckpt"), run_config=str(cfg_path))
    store = open_store(settings)
    yield settings, load_service_config(settings), store
    store.close()


RUN = "svc"


def start(settings, cfg, store) -> TrainerService:
    trainer = TrainerService(settings, cfg, store, bus=None, model="searcher")
    trainer.load()
    trainer.weights.activate(RUN, cfg)
    return trainer


def step(trainer: TrainerService) -> None:
    """One Adam step on a fixed loss (deterministic on CPU)."""
    lm = trainer.lm
    lm.model.train()
    lm.optimizer.zero_grad()
    lm.model(input_ids=BATCH).logits.float().pow(2).mean().backward()
    lm.optimizer.step()
    lm.model.eval()


def params(trainer: TrainerService) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.lm.model.named_parameters()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_restart_restores_optimizer_state_and_continues_exactly(deployment):
    settings, cfg, store = deployment
    first = start(settings, cfg, store)
    for _ in range(3):
        step(first)
    first.weights.save_checkpoint(1, round_id=None, run_id=RUN)

    second = start(settings, cfg, store)  # the "restarted" trainer
    assert second.lm.version == 1
    saved, restored = first.lm.optimizer.state_dict(), second.lm.optimizer.state_dict()
    assert restored["param_groups"] == saved["param_groups"]
    assert saved["state"] and restored["state"].keys() == saved["state"].keys()
    for index, moments in saved["state"].items():
        assert float(restored["state"][index]["step"]) == float(moments["step"]) == 3.0
        assert_same({k: v for k, v in moments.items() if k != "step"},
                    {k: v for k, v in restored["state"][index].items() if k != "step"})
    assert_same(params(first), params(second))

    step(first)
    step(second)
    assert_same(params(first), params(second))

    # Control: a restart WITHOUT the moments (the old behaviour) takes a different step.
    fresh = start(settings, cfg, store)
    fresh.lm.optimizer = torch.optim.Adam(fresh.lm.model.parameters(),
                                          lr=cfg.models["searcher"].lr)
    step(fresh)
    assert not torch.equal(params(fresh)["model.norm.weight"], params(first)["model.norm.weight"])


def test_corrupted_optimizer_state_is_refused(deployment):
    settings, cfg, store = deployment
    first = start(settings, cfg, store)
    step(first)
    uri = first.weights.save_checkpoint(1, round_id=None, run_id=RUN)
    path = optimizer_state_uri(uri)
    with open(path, "r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(OptimizerStateError, match="corrupted"):
        start(settings, cfg, store)


def test_trainer_removes_leftovers_of_killed_writes(deployment):
    """A trainer killed mid-save leaves a temp folder, a temp optimizer file, or a complete
    version it never recorded; the next trainer of the run removes them (issue 16 item 4)
    and resumes from the recorded version."""
    from mgrpo.models.checkpoint import save_checkpoint

    settings, cfg, store = deployment
    first = start(settings, cfg, store)
    step(first)
    first.weights.save_checkpoint(1, round_id=None, run_id=RUN)
    step(first)
    folder = Path(first.weights.run_root(RUN)) / "searcher"
    save_checkpoint(first.lm.model, first.weights.run_root(RUN), "searcher", 2)  # never recorded
    (folder / ".tmp-v000003-0000aaaa").mkdir()
    (folder / "v000003.optimizer.pt.tmp-0000bbbb").write_bytes(b"torn")
    second = start(settings, cfg, store)
    assert sorted(p.name for p in folder.iterdir()) == ["v000001", "v000001.optimizer.pt"]
    assert second.lm.version == 1
    assert [c.version for c in store.list_checkpoints("searcher", run_id=RUN)] == [1]


def _record_fails_once(store, monkeypatch) -> None:
    """The store's first ``record_checkpoint`` raises the driver's transient error (the
    database restarting between the checkpoint write and its record)."""
    from sqlalchemy.exc import OperationalError

    real, calls = store.record_checkpoint, []

    def record(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("INSERT INTO checkpoints", {}, Exception("server closed"))
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "record_checkpoint", record)


def test_retry_records_the_unrecorded_version_it_wrote_already(deployment, monkeypatch):
    """The retry of a save whose record failed finds the same complete version folder, with
    the same weights and optimizer state, and records it instead of refusing it."""
    from sqlalchemy.exc import OperationalError

    settings, cfg, store = deployment
    trainer = start(settings, cfg, store)
    step(trainer)
    _record_fails_once(store, monkeypatch)
    with pytest.raises(OperationalError):
        trainer.weights.save_checkpoint(1, round_id=None, run_id=RUN)
    written = (Path(trainer.weights.run_root(RUN)) / "searcher" / "v000001" / "manifest.json")
    first_manifest = written.read_bytes()
    uri = trainer.weights.save_checkpoint(1, round_id=None, run_id=RUN)  # the retry
    assert written.read_bytes() == first_manifest  # recorded as written, not rewritten
    record = store.latest_checkpoint("searcher", run_id=RUN)
    assert (record.version, record.uri) == (1, uri)
    assert record.sha256 == hashlib.sha256(first_manifest).hexdigest()
    restarted = start(settings, cfg, store)
    assert_same(params(trainer), params(restarted))


def test_retry_with_other_weights_replaces_the_unrecorded_version(deployment, monkeypatch):
    """An unrecorded version whose content differs from the retry's (a nondeterministic
    update) is discarded and written again; nobody ever loaded it."""
    from sqlalchemy.exc import OperationalError

    settings, cfg, store = deployment
    trainer = start(settings, cfg, store)
    step(trainer)
    _record_fails_once(store, monkeypatch)
    with pytest.raises(OperationalError):
        trainer.weights.save_checkpoint(1, round_id=None, run_id=RUN)
    step(trainer)
    trainer.weights.save_checkpoint(1, round_id=None, run_id=RUN)
    restarted = start(settings, cfg, store)
    assert restarted.lm.version == 1
    assert_same(params(trainer), params(restarted))
    folder = Path(trainer.weights.run_root(RUN)) / "searcher"
    assert sorted(p.name for p in folder.iterdir()) == ["v000001", "v000001.optimizer.pt"]


def test_keep_checkpoints_deletes_older_versions_and_their_records(deployment):
    """``keep_checkpoints`` in the trainer service: after each recorded version, the run's
    versions older than the newest ``keep`` go, files and store records; a restart resumes
    from the newest."""
    settings, cfg, store = deployment
    trainer = start(settings, cfg, store)
    for version in (1, 2, 3):
        step(trainer)
        trainer.weights.save_checkpoint(version, round_id=None, run_id=RUN, keep=2)
    folder = Path(trainer.weights.run_root(RUN)) / "searcher"
    assert sorted(p.name for p in folder.iterdir()) == [
        "v000002", "v000002.optimizer.pt", "v000003", "v000003.optimizer.pt"]
    assert [c.version for c in store.list_checkpoints("searcher", run_id=RUN)] == [2, 3]
    restarted = start(settings, cfg, store)
    assert restarted.lm.version == 3
    assert_same(params(trainer), params(restarted))
