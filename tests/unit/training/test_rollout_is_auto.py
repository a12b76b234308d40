"""``loss.rollout_is: auto`` (the default): the correction is on where the sampler's logprobs
differ from the trainer's by construction (a bf16-trained model, stale samples), off
elsewhere; an explicit ``none`` beside bf16 is warned about, and only then."""

from __future__ import annotations

from mgrpo.training.config import RunConfig

MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _cfg(**extra) -> RunConfig:
    return RunConfig.model_validate({"models": MODELS, "out_dir": "/tmp/x", **extra})


def test_auto_resolves_by_precision_and_staleness():
    assert _cfg().loss.rollout_is == "none"
    bf16 = {**MODELS, "planner": {"path": "/nowhere", "dtype": "bfloat16"}}
    assert _cfg(models=bf16).loss.rollout_is == "token"
    stale = {**MODELS, "searcher": {"path": "/nowhere", "max_staleness": 1}}
    assert _cfg(models=stale).loss.rollout_is == "token"
    assert _cfg(models=bf16, loss={"rollout_is": "sequence"}).loss.rollout_is == "sequence"


def test_the_precision_warning_fires_only_when_uncorrected():
    bf16 = {**MODELS, "planner": {"path": "/nowhere", "dtype": "bfloat16"}}
    warned = _cfg(models=bf16, loss={"rollout_is": "none"}).precision_warnings()
    assert len(warned) == 1 and warned[0].startswith("models.planner: dtype bfloat16")
    assert _cfg(models=bf16).precision_warnings() == []
    assert _cfg(loss={"rollout_is": "none"}).precision_warnings() == []
