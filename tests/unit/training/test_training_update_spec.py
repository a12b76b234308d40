"""UpdateSpec: the update's settings read from the run config in one place, and a Dr. GRPO
update without its constant L refused when the spec is built."""

from __future__ import annotations

import pytest
from training_testkit import run_config_dict

from mgrpo.training.config import LossConfig, ModelConfig, RunConfig
from mgrpo.training.update import UpdateSpec


def test_for_run_reads_the_models_config_temperature_length_and_schedule(tmp_path, tiny_dir,
                                                                         bench_dir):
    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, sampling={"temperature": 0.7, "max_new_tokens": 6,
                                                 "planner_max_turns": 2,
                                                 "subagent_max_turns": 3},
        stages=[{"stage": 1, "rounds": 3}]))
    spec = UpdateSpec.for_run(cfg, "searcher", pad_id=5)
    assert spec.model_cfg is cfg.models["searcher"] and spec.loss_cfg is cfg.loss
    assert (spec.pad_id, spec.temperature) == (5, 0.7)
    assert spec.norm_length == 6 * 3  # max_new_tokens x the larger turn limit
    assert spec.total_steps == 3  # 3 rounds x 1 mini-batch x 1 epoch
    assert spec.recompute_old and spec.reuse_first_pass


def test_seq_mean_token_sum_norm_without_norm_length_is_refused_at_build():
    mcfg, loss = ModelConfig(path="-"), LossConfig(agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="needs norm_length"):
        UpdateSpec(mcfg, loss, pad_id=0)
    assert UpdateSpec(mcfg, loss, pad_id=0, norm_length=48).norm_length == 48
