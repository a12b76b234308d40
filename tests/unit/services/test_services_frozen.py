"""Frozen models in distributed mode (main-only, issue 10): their trajectories are stored,
scored and reported as in embedded mode (rewards, group statistics, d, judge counts), and
never trained or checkpointed. The services run in one process (in-memory bus, SQLite,
scripted policies); numbers equal to embedded mode are checked by the ``main-only`` parity
test (tests/integration/services/test_services_algorithms.py)."""

from __future__ import annotations

import pytest
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    wait_done,
    write_run_config,
)

from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round

FROZEN = ("searcher", "coder")


@pytest.fixture(scope="module")
def main_only(tmp_path_factory):
    root = tmp_path_factory.mktemp("frozen")
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), k=2, queries=3, frozen=FROZEN)
    with in_process_services(embedded_settings(root, cfg_path),
                             trainers=("planner", *FROZEN)) as svc:
        record = start_round(svc.store, svc.bus, svc.cfg, Queues())
        status = wait_done(svc.store, record.round_id)
        yield svc.store, record, status, svc.trainers


def test_frozen_models_are_scored_as_in_embedded_mode(main_only):
    store, record, status, _ = main_only
    assert status == "done"
    rid = record.round_id
    assert record.config["trained_models"] == ["planner"]
    metrics = store.metrics(record.run_id, rid)[rid]
    for role in FROZEN:
        trajs = store.round_trajectories(rid, role)
        assert trajs and {t.agent for t in trajs} == {role}
        for key in ("reward_mean", "reward_std", "adv_abs_mean", "samples", "d",
                    "expert_judged"):
            assert f"{role}/{key}" in metrics, f"{role}/{key} missing: {sorted(metrics)}"
        assert metrics[f"{role}/expert_judged"] == float(sum(t.format_ok for t in trajs))
        assert 0.0 <= metrics[f"{role}/reward_mean"] <= 1.0
    stats = store.read_group_stats(rid)
    assert {s.model for s in stats if s.n > 0} == {"planner", *FROZEN}
    assert store.published_models(rid) == {"planner", *FROZEN}


def test_frozen_models_are_never_trained(main_only, tmp_path):
    import torch

    from mgrpo.models import load_model

    store, record, _, trainers = main_only
    assert {c.model for c in store.list_checkpoints()} == {"planner"}
    folder = load_model(record.config["models"]["searcher"]["path"])[0].state_dict()
    for name, tensor in trainers["searcher"].lm.model.state_dict().items():
        assert torch.equal(tensor, folder[name]), name
    assert all(t.lm.optimizer is None for m, t in trainers.items() if m in FROZEN)
