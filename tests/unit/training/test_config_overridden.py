"""``overridden``: a run config with a round's overrides set and validated again as a whole.
``model_copy(update=...)`` keeps whatever it is handed unchecked; ``overridden`` refuses what
``RunConfig`` refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mgrpo.training.config import InitFrom, RunConfig
from mgrpo.training.overrides import overridden

MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _cfg(**extra) -> RunConfig:
    return RunConfig.model_validate({"models": MODELS, "out_dir": "/tmp/x", **extra})


@pytest.mark.parametrize("overrides", [
    {"k": 1},                                   # k >= 2
    {"queries_per_round": 0},                   # queries_per_round >= 1
    {"init_from": {"run_id": "not a run id"}},  # RUN_ID_PATTERN
    {"algorithm": "no_such_algorithm"},         # a registered algorithm
    {"verifier": "llm"},                        # needs verifier_llm (a cross-field check)
])
def test_an_override_the_run_config_refuses_is_refused(overrides):
    cfg = _cfg()
    unchecked = cfg.model_copy(update=overrides)  # what the round routes used to do
    assert all(getattr(unchecked, key) == value for key, value in overrides.items())
    with pytest.raises(ValidationError):
        overridden(cfg, overrides)


def test_valid_overrides_are_set_and_the_rest_is_kept():
    cfg = _cfg(seed=7)
    init = InitFrom(run_id="other", version=3)
    out = overridden(cfg, {"k": 4, "queries_per_round": 3, "init_from": init})
    assert (out.k, out.queries_per_round, out.init_from) == (4, 3, init)
    assert out.model_dump() == cfg.model_copy(
        update={"k": 4, "queries_per_round": 3, "init_from": init}).model_dump()
    assert cfg.k == 8 and cfg.init_from is None  # the original is left as it was
    assert overridden(cfg, {}).model_dump() == cfg.model_dump()
