"""``mgrpo.dashboard.data`` without a server: which chart a metric key lands in, and a
metrics.csv being written while we read it."""

from __future__ import annotations

import pytest

from mgrpo.dashboard.data import _chart_of, read_metrics_csv


@pytest.mark.parametrize(("key", "chart"), [
    ("planner/reward_mean", "reward"), ("searcher/reward_mean", "reward"),
    ("planner/accuracy", "accuracy"), ("eval/greedy/accuracy", "accuracy"),
    ("eval/greedy/accuracy_chain", None), ("planner/format_valid", "format rate"),
    ("coder/calls_per_episode", "calls per episode"), ("planner/clipfrac", "clip fraction"),
    ("planner/clipfrac_low", None), ("searcher/kl", "KL"), ("planner/approx_kl", "KL"),
    ("coder/rollout_logp_diff_mean", "train/inference logprob mismatch"),
    ("planner/rollout_kl", "train/inference logprob mismatch"),
    ("time/rollout_s", "round time (s)"), ("planner/grad_norm", None),
    # held-out calls beside the training ones (the chart said "no data yet" after a run
    # whose evaluation recorded 1.3 searcher calls), never in the KL chart
    ("eval/greedy/calls_searcher", "calls per episode"),
    ("eval/sampled/calls_kl", "calls per episode"),
    ("planner/frac_reward_zero_std", "groups with zero reward variance"),
])
def test_keys_land_in_their_chart(key, chart):
    assert _chart_of(key) == chart


def test_a_torn_last_csv_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("round,key,value\n0,planner/accuracy,0.5\n1,planner/accuracy,0.75\n1,plan")
    assert read_metrics_csv(path) == {0: {"planner/accuracy": 0.5},
                                      1: {"planner/accuracy": 0.75}}
    assert read_metrics_csv(tmp_path / "missing.csv") == {}


def test_a_running_round_shows_its_outcomes_so_far(tmp_path):
    """Round metrics are recorded only once a round is trained; while it runs the rounds
    table shows R_M, accuracy and format rate of the rollouts completed so far."""
    from mgrpo.dashboard.data import run_rounds
    from mgrpo.store import Store
    from mgrpo.store.records import PlannerOutcomeIn

    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    store.create_run("live", "live", {})
    store.create_round("live", "live-r0000", 0, ["q1", "q2"], 2)
    store.set_round_status("live-r0000", "running")
    assert run_rounds(store, "live")[0]["live"] is None  # nothing completed yet
    store.write_planner_outcomes("live-r0000", [
        PlannerOutcomeIn(query_id="q1", rollout=0, attempt=0, format_ok=True, correct=1.0,
                         reward=1.1),
        PlannerOutcomeIn(query_id="q1", rollout=1, attempt=0, format_ok=False, correct=0.0,
                         reward=0.0)])
    for rollout in (0, 1):
        store.complete_rollout("live-r0000", "q1", rollout, store.begin_attempt(
            "live-r0000", "q1", rollout))
    (row,) = run_rounds(store, "live")
    assert row["rollouts_completed"] == 2 and row["rollouts_total"] == 4
    assert row["live"] == {"n": 2, "reward_mean": pytest.approx(0.55), "accuracy": 0.5,
                           "format_valid": 0.5}
    store.set_round_status("live-r0000", "done")
    assert run_rounds(store, "live")[0]["live"] is None


def test_a_runs_config_is_read_typed_once(tmp_path):
    """The header and the planned rounds come from the stored config parsed as a RunConfig;
    a run stored without one, or with one that does not validate, shows without it."""
    from mgrpo.dashboard.data import list_runs, run_summary
    from mgrpo.store import Store
    from mgrpo.training.config import ModelConfig, RunConfig

    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    cfg = RunConfig(models={"planner": ModelConfig(path="p0"), "searcher": ModelConfig(
        path="s0"), "coder": ModelConfig(path="c0")}, k=4, queries_per_round=3,
        stages=[{"stage": 1, "rounds": 2}, {"stage": 2, "rounds": 5}])
    store.create_run("typed", "typed", cfg.model_dump(mode="json"))
    store.create_run("bare", "bare", {})
    store.create_run("odd", "odd", {"models": {"planner": {"path": "p", "typo": 1}}})
    summary = run_summary(store, "typed")
    assert (summary["algorithm"], summary["k"], summary["queries_per_round"]) == ("mgrpo", 4, 3)
    assert summary["models"] == {"planner": "p0", "searcher": "s0", "coder": "c0"}
    assert summary["agents"] == dict(cfg.agents) and summary["rounds_planned"] == 7
    for run_id in ("bare", "odd"):
        summary = run_summary(store, run_id)
        assert (summary["algorithm"], summary["models"], summary["rounds_planned"]) == \
            (None, {}, None)
    planned = {r["run_id"]: r["rounds_planned"] for r in list_runs(store)}
    assert planned == {"typed": 7, "bare": None, "odd": None}
