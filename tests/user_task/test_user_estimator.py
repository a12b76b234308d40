"""An advantage estimator from outside the library (``acme_task.estimator``: one file, one
``@register_estimator``) selected by a run config's ``loss.advantage_estimator``, trained one
tiny round embedded: its advantages reach the round's metrics and the update. A name no
module registered is refused in one line that lists the valid ones."""

from __future__ import annotations

import csv

import pytest
from benchmark_sizes import small_bench_config
from pydantic import ValidationError

from mgrpo.training.config import RunConfig


def _config(tmp_path, estimator: str | None) -> dict:
    from mgrpo.envs import build_benchmark
    from mgrpo.models import TinyModelConfig, init_tiny

    bench, tiny = tmp_path / "bench", tmp_path / "tiny"
    if not bench.exists():
        build_benchmark(small_bench_config()).save(bench)
        init_tiny(tiny, TinyModelConfig(hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        intermediate_size=64, vocab_size=400))
    return {
        "name": "acme-estimator", "seed": 0, "plugins": ["acme_task.estimator"],
        "models": {m: {"path": str(tiny), "lr": 1e-3, "micro_batch_size": 4}
                   for m in ("planner", "searcher", "coder")},
        "k": 2, "queries_per_round": 2, "eval_questions": 1, "eval_every": 0,
        "sampling": {"planner_max_turns": 2, "subagent_max_turns": 2, "max_new_tokens": 6},
        "stages": [{"stage": 1, "rounds": 1}], "report_to": [],
        "loss": {} if estimator is None else {"advantage_estimator": estimator},
        "bench_dir": str(bench), "out_dir": str(tmp_path / f"run-{estimator}")}


def _round_metrics(cfg: RunConfig) -> dict[str, float]:
    from mgrpo.training.loop import run_training

    run_training(cfg, progress=False)
    with open(f"{cfg.out_dir}/metrics.csv") as f:
        return {r["key"]: float(r["value"]) for r in csv.DictReader(f) if r["round"] == "0"}


def test_a_users_estimator_trains_a_round(tmp_path):
    cfg = RunConfig.model_validate(_config(tmp_path, "acme_fixed_baseline"))
    assert cfg.advantage_estimator() == "acme_fixed_baseline"
    own = _round_metrics(cfg)
    # the tiny model earns no reward: the group mean gives A = 0, the fixed baseline -0.5
    assert own["planner/reward_mean"] == 0.0
    assert own["planner/adv_abs_mean"] == pytest.approx(0.5)
    assert own["planner/grad_norm"] > 0  # the update trained on them
    grpo = _round_metrics(RunConfig.model_validate(_config(tmp_path, None)))
    assert grpo["planner/reward_mean"] == 0.0
    assert grpo["planner/adv_abs_mean"] == 0.0 and grpo["planner/grad_norm"] == 0.0


def test_an_unregistered_estimator_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate(_config(tmp_path, "acme_fixed_baseline_typo"))
    message = str(err.value)
    assert "loss.advantage_estimator: unknown advantage estimator " \
           "'acme_fixed_baseline_typo'; valid: acme_fixed_baseline, at_grpo, dr_grpo, grpo, " \
           "mgrpo" in message
