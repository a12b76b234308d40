"""The asynchronous embedded mode (mgrpo.training.pipeline) on tiny models.

- max_staleness 0 through the pipeline = the synchronous loop (``run_round``), bit for bit.
- max_staleness 1: round r is sampled by version r - 1 (recorded per trajectory, reported
  as ``{model}/staleness_max``), round r + 1 is sampled WHILE round r trains, and nothing is
  lost: every round is stored and trained once.
- the config refuses what the mode cannot run.
"""

from __future__ import annotations

import threading

import pytest
import torch
from training_testkit import run_config_dict

from mgrpo.training.config import RunConfig


@pytest.fixture(scope="module")
def ref_dir(tiny_dir, tmp_path_factory):
    """A KL reference a little away from the start, so every trained model moves from round
    0 on (an untrained tiny model scores 0 everywhere: its advantages are all 0)."""
    from mgrpo.models import load_model

    path = tmp_path_factory.mktemp("ref")
    model, tokenizer = load_model(tiny_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _cfg(tmp_path, tiny_dir, bench_dir, ref_dir, **kw) -> RunConfig:
    base = run_config_dict(tmp_path, tiny_dir, bench_dir,
                           stages=[{"stage": 1, "rounds": 3}],
                           loss={"rollout_is": "token", "kl_coef": 0.5})
    for model in base["models"].values():
        model["ref_path"] = str(ref_dir)
    return RunConfig.model_validate({**base, **kw})


def _weights(system) -> dict[str, dict[str, torch.Tensor]]:
    return {m: {k: v.clone() for k, v in lm.model.state_dict().items()}
            for m, lm in system.models.items()}


def _fresh(cfg):
    from pathlib import Path

    from mgrpo.store import Store
    from mgrpo.training.system import build_system

    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir) / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    return system, store


def _trajectories(store, run_id: str, model: str) -> list:
    return sorted((t.traj_id, tuple(t.input_ids), t.weights_version)
                   for r in store.list_rounds(run_id)
                   for t in store.round_trajectories(r.round_id, model))


def test_staleness_zero_pipeline_is_the_synchronous_round(tmp_path, tiny_dir, bench_dir,
                                                          ref_dir):
    from mgrpo.training.loop import run_round, stage_pool, stage_schedule
    from mgrpo.training.pipeline import run_pipelined

    sync_cfg = _cfg(tmp_path / "sync", tiny_dir, bench_dir, ref_dir)
    system, store = _fresh(sync_cfg)
    start = _weights(system)
    pool = stage_pool(system, 0, sync_cfg.name)
    for _, r in stage_schedule(sync_cfg):
        run_round(system, store, sync_cfg.name, r, pool)
    sync_w = _weights(system)

    pipe_cfg = _cfg(tmp_path / "pipe", tiny_dir, bench_dir, ref_dir)
    assert pipe_cfg.staleness("planner") == 0
    system2, store2 = _fresh(pipe_cfg)
    assert run_pipelined(system2, store2, pipe_cfg.name, stage_schedule(pipe_cfg)) == 3
    pipe_w = _weights(system2)
    # The untrained planner never delegates: only it has samples (and moves).
    assert any(not torch.equal(sync_w["planner"][k], start["planner"][k])
               for k in sync_w["planner"])
    for m in sync_w:
        for k in sync_w[m]:
            assert torch.equal(sync_w[m][k], pipe_w[m][k]), f"{m}.{k} differs"
        assert _trajectories(store, "t", m) == _trajectories(store2, "t", m)


def test_staleness_one_samples_ahead_and_loses_nothing(tmp_path, tiny_dir, bench_dir,
                                                       ref_dir, monkeypatch):
    from mgrpo.store import Store
    from mgrpo.training import pipeline
    from mgrpo.training.loop import run_training

    started = {r: threading.Event() for r in range(3)}
    real_collect, real_finish = pipeline.collect, pipeline.finish_round

    def collect(system, round_id, *a, **kw):
        started[int(round_id.rsplit("-r", 1)[1])].set()
        return real_collect(system, round_id, *a, **kw)

    def finish_round(system, store, run_id, round_index, *a, **kw):
        # Round r+1 must be sampling while round r trains (no overlap: this times out).
        if round_index + 1 in started:
            assert started[round_index + 1].wait(timeout=120), "no overlap"
        return real_finish(system, store, run_id, round_index, *a, **kw)

    monkeypatch.setattr(pipeline, "collect", collect)
    monkeypatch.setattr(pipeline, "finish_round", finish_round)
    cfg = _cfg(tmp_path, tiny_dir, bench_dir, ref_dir, max_staleness=1)
    result = run_training(cfg, progress=False)
    assert result.rounds == 3 and "eval/greedy/accuracy" in result.after
    store = Store(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    rounds = store.list_rounds("t")
    assert [r.index for r in rounds] == [0, 1, 2] and all(r.status == "done" for r in rounds)
    for r in rounds:
        expected = max(r.index - 1, 0)  # the oldest version the bound allows
        for model in ("planner", "searcher", "coder"):
            trajs = store.round_trajectories(r.round_id, model)
            if model == "planner":
                assert len(trajs) == cfg.queries_per_round * cfg.k
            assert {t.weights_version for t in trajs} <= {expected}
            assert len({t.traj_id for t in trajs}) == len(trajs)
        metrics = store.metrics("t", r.round_id)[r.round_id]
        assert metrics["planner/staleness_max"] == min(r.index, 1)
        assert "planner/rollout_is_mean" in metrics  # decoupled correction applied
    assert '"completed_rounds": 3' in (tmp_path / "run" / "state.json").read_text()


def test_per_model_override_and_refusals(tmp_path, tiny_dir, bench_dir):
    base = run_config_dict(tmp_path, tiny_dir, bench_dir, loss={"rollout_is": "token"})
    base["models"]["coder"]["max_staleness"] = 0
    cfg = RunConfig.model_validate({**base, "max_staleness": 2})
    assert [cfg.staleness(m) for m in ("planner", "searcher", "coder")] == [2, 2, 0]
    auto = RunConfig.model_validate({**base, "max_staleness": 1, "loss": {}})
    assert auto.loss.rollout_is == "token"  # auto: stale samples are corrected
    with pytest.raises(ValueError, match="needs loss.rollout_is"):
        RunConfig.model_validate({**base, "max_staleness": 1, "loss": {"rollout_is": "none"}})
    with pytest.raises(ValueError, match="AT-GRPO"):
        RunConfig.model_validate({**base, "max_staleness": 1, "algorithm": "at_grpo"})
    with pytest.raises(ValueError, match="max_staleness"):
        RunConfig.model_validate({**base, "max_stalenes": 1})  # unknown key


def test_resumed_async_run_restarts_its_pipeline(tmp_path, tiny_dir, bench_dir, ref_dir):
    """Killed after 2 of 3 rounds (stop_after) and resumed: round 2 is sampled by the state
    file's version 2 (the pipeline restarts; staleness 0), rounds 0-1 are not replayed."""
    from mgrpo.store import Store
    from mgrpo.training.loop import run_training

    cfg = _cfg(tmp_path, tiny_dir, bench_dir, ref_dir, max_staleness=1)
    assert run_training(cfg, progress=False, stop_after=2).rounds == 2
    result = run_training(cfg, progress=False, resume=True)
    assert result.rounds == 3 and result.after
    store = Store(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    versions = {r.index: {t.weights_version for t in store.round_trajectories(r.round_id,
                                                                              "planner")}
                for r in store.list_rounds("t")}
    assert versions == {0: {0}, 1: {0}, 2: {2}}
    assert store.metrics("t", "t-r0002")["t-r0002"]["planner/staleness_max"] == 0
