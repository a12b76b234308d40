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
    ("time/rollout_s", "round time (s)"), ("eval/greedy/calls_kl", None),
    ("planner/grad_norm", None),
])
def test_keys_land_in_their_chart(key, chart):
    assert _chart_of(key) == chart


def test_a_torn_last_csv_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("round,key,value\n0,planner/accuracy,0.5\n1,planner/accuracy,0.75\n1,plan")
    assert read_metrics_csv(path) == {0: {"planner/accuracy": 0.5},
                                      1: {"planner/accuracy": 0.75}}
    assert read_metrics_csv(tmp_path / "missing.csv") == {}
