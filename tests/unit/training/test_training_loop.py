"""The embedded loop on tiny models: 2 rounds, rows in the SQLite store, metrics.csv."""

from __future__ import annotations

import csv

import pytest
from training_testkit import run_config_dict

from mgrpo.training.config import RunConfig
from mgrpo.training.loop import run_training


@pytest.mark.parametrize("algorithm", ["mgrpo", "at_grpo", "grpo"])
def test_two_rounds_write_the_store_and_csv(algorithm, tmp_path, tiny_dir, bench_dir):
    from mgrpo.store import Store

    cfg = RunConfig.model_validate(run_config_dict(tmp_path, tiny_dir, bench_dir,
                                                   algorithm=algorithm))
    result = run_training(cfg, progress=False)
    assert result.rounds == 2
    assert "eval/greedy/accuracy" in result.before and "eval/greedy/accuracy" in result.after
    store = Store(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    rounds = store.list_rounds("t")
    assert [r.index for r in rounds] == [0, 1] and all(r.status == "done" for r in rounds)
    for r in rounds:
        planner = store.round_trajectories(r.round_id, "planner")
        # mgrpo/grpo: one planner trajectory per rollout; at_grpo: >= K candidates per query
        assert len(planner) >= cfg.queries_per_round * cfg.k
        assert {t.rollout for t in planner} == set(range(cfg.k))
        stats = store.read_group_stats(r.round_id, "planner")
        assert len(stats) >= cfg.queries_per_round
        metrics = store.metrics("t", r.round_id)[r.round_id]
        assert 0.0 <= metrics["planner/accuracy"] <= 1.0 and metrics["time/rollout_s"] > 0
        assert "planner/grad_norm" in metrics  # the planner's trainer did update
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {row["round"] for row in rows} >= {"0", "1"}
    assert {"planner/accuracy", "time/update_s"} <= {row["key"] for row in rows}
    state = (tmp_path / "run" / "state.json").read_text()
    assert '"completed_rounds": 2' in state
