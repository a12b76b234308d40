"""RoundSpec: a round's stored config parsed once, typed, and written back unchanged."""

from __future__ import annotations

import pytest

from mgrpo.training.config import ModelConfig, RunConfig
from mgrpo.training.round_spec import RoundSpec


def _cfg(**over) -> RunConfig:
    models = {m: ModelConfig(path=f"/m/{m}") for m in ("planner", "searcher", "coder")}
    return RunConfig(models=models, **over)


def test_stored_form_is_the_run_config_plus_the_round_keys():
    cfg = _cfg(seed=7, algorithm="at_grpo")
    spec = RoundSpec.of(cfg, ["planner"], ["planner", "coder"])
    assert spec.stored() == {**cfg.model_dump(mode="json"), "trained_models": ["planner"],
                             "scored_models": ["planner", "coder"]}
    back = RoundSpec.from_stored(spec.stored())
    assert back == spec and back.run == cfg and back.run.seed == 7
    assert back.round_play(0) == "tree"
    assert back.round_play(-1) == "episodes"  # a filter round plays episodes


def test_scored_defaults_to_trained_and_a_bare_round_takes_the_default():
    cfg = _cfg()
    stored = {**cfg.model_dump(mode="json"), "trained_models": ["coder"]}
    assert RoundSpec.from_stored(stored).scored_models == ["coder"]
    bare = RoundSpec.from_stored({"trained_models": ["planner"]}, default=cfg)
    assert (bare.trained_models, bare.scored_models, bare.run) == \
        (["planner"], ["planner"], cfg)
    assert RoundSpec.from_stored({}) is None  # no run config and no default
    assert RoundSpec.from_stored(cfg.model_dump(mode="json")).scored_models == []  # a run's


def test_a_bad_stored_config_fails_with_the_field():
    stored = {**_cfg().model_dump(mode="json"), "algorithm": "ppo"}
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; valid"):
        RoundSpec.from_stored(stored)
