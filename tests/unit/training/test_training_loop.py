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
        # every sampled token of the round (all agents; AT-GRPO: all K candidates of every
        # turn), the measure of issue 17.6's equal-token comparison
        stored = [t for m in cfg.models for t in store.round_trajectories(r.round_id, m)]
        assert metrics["rollout/generated_tokens"] == sum(sum(t.response_mask) for t in stored)
        assert metrics["rollout/generated_tokens"] > 0
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {row["round"] for row in rows} >= {"0", "1"}
    assert {"planner/accuracy", "time/update_s"} <= {row["key"] for row in rows}
    state = (tmp_path / "run" / "state.json").read_text()
    assert '"completed_rounds": 2' in state


def test_auto_d_reads_this_runs_history_only(tmp_path, tiny_dir, bench_dir):
    """Issue 10.6: ``d: auto`` took the 99th percentile of every d_k in the store, so
    another run sharing the store (one PostgreSQL for all runs in distributed mode) set
    this run's alignment size. Here a finished run "other" called the searcher 9 times per
    rollout; this run's own rollouts decide its d."""
    from mgrpo.store import Store
    from mgrpo.store.records import DCount
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.rounds import choose_d
    from mgrpo.training.system import build_system

    cfg = RunConfig.model_validate(run_config_dict(tmp_path, tiny_dir, bench_dir))
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    store.create_run("other", "other", {})
    store.create_round("other", "other-r0000", 0, ["q1"], 40)
    for rollout in range(40):
        store.complete_rollout("other-r0000", "q1", rollout, 0)
    store.record_d_counts("searcher", "other-r0000",
                          [DCount(query_id="q1", rollout=r, d=9) for r in range(40)])
    assert choose_d(cfg, store.d_counts("searcher")) == 9
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    system = build_system(cfg)
    metrics = run_round(system, store, cfg.name, 0, stage_pool(system, 0))
    assert metrics["searcher/d"] < 9
    own = store.d_counts("searcher", run_id=cfg.name)
    assert len(own) == cfg.queries_per_round * cfg.k and max(own) < 9
    assert metrics["searcher/d"] == choose_d(cfg, own)


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_runs_in_one_out_dir_keep_their_own_checkpoints(tmp_path, tiny_dir, bench_dir):
    """Issue 11 item 2 in embedded mode: run b in run a's out_dir rewrote a's
    ``checkpoints/planner/v000001``. Now each run has its own versions; b starts from its
    model folder, or from a's weights only when ``init_from`` says so. Run a starts from a
    copy of the tiny model shifted by 0.5, so "whose weights" is a distance."""
    import json

    import torch

    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import load_checkpoint

    shifted, tokenizer = load_model(tiny_dir)
    with torch.no_grad():
        for param in shifted.parameters():
            param.add_(0.5)
    shifted.save_pretrained(tmp_path / "shifted")
    tokenizer.save_pretrained(tmp_path / "shifted")
    one = {"stages": [{"stage": 1, "rounds": 1}]}
    cfg_a = run_config_dict(tmp_path, tiny_dir, bench_dir, name="a", **one)
    for model in cfg_a["models"].values():
        model["path"] = str(tmp_path / "shifted")
    run_a = RunConfig.model_validate(cfg_a)
    run_training(run_a, progress=False)
    root = tmp_path / "run" / "checkpoints"
    a_files = _files(root / "a")
    assert {"planner/v000001/manifest.json", "coder/v000001/manifest.json"} <= set(a_files)
    state_a, _ = load_checkpoint(str(root / "a"), "planner", 1)
    base = load_model(tiny_dir)[0].state_dict()
    assert _max_diff(state_a, base) > 0.4

    run_b = RunConfig.model_validate(run_config_dict(tmp_path, tiny_dir, bench_dir, name="b",
                                                     **one))
    run_training(run_b, progress=False)
    assert _files(root / "a") == a_files
    state_b, _ = load_checkpoint(str(root / "b"), "planner", 1)
    assert _max_diff(state_b, base) < 0.1  # from its own folder, not from a's weights
    assert json.loads((tmp_path / "run" / "state.json").read_text())["run_id"] == "b"

    with pytest.raises(FileExistsError, match="already has checkpoints"):
        run_training(run_a, progress=False)  # a again, not resumed: never rewritten
    assert _files(root / "a") == a_files

    fork = RunConfig.model_validate({**run_config_dict(tmp_path, tiny_dir, bench_dir,
                                                       name="fork", **one),
                                     "init_from": {"run_id": "a"}})
    run_training(fork, progress=False)
    state_f, manifest = load_checkpoint(str(root / "fork"), "planner", 1)
    assert manifest["extra"]["run_id"] == "fork"
    assert _max_diff(state_f, state_a) < 0.1 < 0.4 < _max_diff(state_f, base)
    assert _files(root / "a") == a_files

    # The CLI gives every run its own out_dir: init_from.out_dir names the source's.
    away = RunConfig.model_validate({
        **run_config_dict(tmp_path / "elsewhere", tiny_dir, bench_dir, name="away", **one),
        "init_from": {"run_id": "a", "version": 1, "out_dir": str(tmp_path / "run")}})
    run_training(away, progress=False)
    state_w, _ = load_checkpoint(str(tmp_path / "elsewhere" / "run" / "checkpoints" / "away"),
                                 "planner", 1)
    assert _max_diff(state_w, state_a) < 0.1


def test_a_resumed_run_reuses_the_stored_filter_pool(tmp_path, tiny_dir, bench_dir):
    """The difficulty filter runs once per stage and run; asked again (a resume), the stage
    gets the stored pool without playing the filter episodes with the resumed weights."""
    from mgrpo.training.stages import clear_pools, pool_path, stage_pool
    from mgrpo.training.system import build_system

    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, stages=[{"stage": 1, "rounds": 1, "max_success": 0.5,
                                                "filter_samples": 1}]))
    system = build_system(cfg)
    first = stage_pool(system, 0)
    assert pool_path(cfg, cfg.name, 0).exists()

    class NoEpisodes:
        def run(self, jobs, greedy=False):
            raise AssertionError("the filter was played again")

    system.runner = lambda greedy=False: NoEpisodes()
    assert [q.id for q in stage_pool(system, 0)] == [q.id for q in first]
    clear_pools(cfg, cfg.name)  # a fresh start forgets it
    with pytest.raises(AssertionError, match="played again"):
        stage_pool(system, 0)
