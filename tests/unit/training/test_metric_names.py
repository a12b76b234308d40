"""Metric namespaces: ``{role}/...`` for a role's rollouts and rewards, ``{model}/...`` for a
model's update; a config where the two would share a name ambiguously is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from mgrpo.training.config import RunConfig
from mgrpo.training.metric_names import namespace_clash
from mgrpo.validation import one_line

ROOT = Path(__file__).resolve().parents[3]
MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder", "qwen")}


@pytest.mark.parametrize("agents", [
    {"planner": "planner", "searcher": "searcher", "coder": "coder"},
    {"planner": "qwen", "searcher": "qwen", "coder": "qwen"},
    {"planner": "planner", "searcher": "qwen", "coder": "qwen"},
])
def test_distinct_or_matching_names_are_accepted(agents):
    assert namespace_clash(agents) is None
    assert RunConfig.model_validate({"models": MODELS, "agents": agents}).agents == agents


@pytest.mark.parametrize(("agents", "played"), [
    ({"planner": "planner", "searcher": "planner"}, "plays roles planner, searcher"),
    ({"planner": "qwen", "searcher": "planner"},
     "plays searcher while role planner is played by qwen"),
])
def test_a_model_named_like_another_roles_namespace_is_refused(agents, played):
    """Before, ``planner/loss`` (the model) sat beside ``planner/reward_mean`` (the role)
    although they described different agents."""
    with pytest.raises(ValidationError) as caught:
        RunConfig.model_validate({"models": MODELS, "agents": agents})
    assert one_line(caught.value) == (
        f"invalid RunConfig: agents: model 'planner' is named like the role planner but "
        f"{played}: its update metrics (planner/loss) would share the planner/ namespace "
        "with role planner's rollout metrics (planner/reward_mean); name the model "
        "differently (e.g. planner_model), or give each role its own")


def test_the_documented_quantities_are_a_roles_or_a_models_never_both():
    table = (ROOT / "docs" / "metrics.md").read_text()
    keys = re.findall(r"`\{(\w+)\}/(\w+)`", table)
    assert {kind for kind, _ in keys} == {"role", "model"}, sorted({k for k, _ in keys})
    role = {q for kind, q in keys if kind == "role"}
    model = {q for kind, q in keys if kind == "model"}
    assert {"reward_mean", "rollout_kl", "calls_per_episode"} <= role
    assert {"loss", "grad_norm", "staleness_max"} <= model
    assert not role & model, role & model
