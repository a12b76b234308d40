"""Workflows as a registered concept: the hierarchy is the default (every existing config
keeps its meaning), a turn_team config fills `agents` from its roles and trains with
AT-GRPO, and mistakes are refused in one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mgrpo.training.config import RunConfig
from mgrpo.workflows import Workflow, get_workflow, register_workflow, workflow_names

MODELS = {m: {"path": "unused"} for m in ("planner", "searcher", "coder")}


def _team(**flow) -> dict:
    return {"models": {"m1": {"path": "unused"}, "m2": {"path": "unused"}},
            "workflow": {"kind": "turn_team", "world": "plan_path",
                         "roles": {"tool": "m1", "plan": "m2"}, **flow}}


def test_no_workflow_is_the_hierarchy_of_agents():
    cfg = RunConfig(models=MODELS)
    assert cfg.workflow is None and cfg.flow.name == "hierarchy"
    assert cfg.flow.roles(cfg) == cfg.agents
    assert cfg.flow.turn_order(cfg) == {"planner": ("searcher", "coder"),
                                        "searcher": ("planner",), "coder": ("planner",)}
    assert cfg.flow.max_turns(cfg) == cfg.sampling.planner_max_turns
    explicit = RunConfig.model_validate({"models": MODELS, "workflow": {"kind": "hierarchy"}})
    assert explicit.flow.name == "hierarchy" and explicit.agents == cfg.agents


def test_turn_team_roles_replace_agents_and_default_to_at_grpo():
    cfg = RunConfig.model_validate(_team(alpha=0.5, max_turns=3))
    assert cfg.agents == {"tool": "m1", "plan": "m2"} and cfg.algorithm == "at_grpo"
    assert cfg.flow.name == "turn_team" and cfg.flow.alpha(cfg) == 0.5
    assert cfg.flow.turn_order(cfg) == {"tool": ("plan",), "plan": ("tool",)}
    assert cfg.flow.max_turns(cfg) == 3
    assert cfg.trained_models() == ["m1", "m2"]
    default = RunConfig.model_validate(_team())
    assert default.flow.alpha(default) == default.at_grpo_alpha
    assert default.flow.max_turns(default) == 2  # the world's own limit
    shared = RunConfig.model_validate({**_team(), "workflow": {
        "kind": "turn_team", "world": "sudoku4", "roles": {"tool": "m1", "plan": "m1"}}})
    assert shared.trained_models() == ["m1"]


@pytest.mark.parametrize("change,message", [
    ({"wrld": "plan_path"}, "did you mean 'world'"),
    ({"world": "nowhere"}, "unknown world 'nowhere'; valid:"),
    ({"roles": {"tool": "m1"}}, "must name exactly the roles of world 'plan_path'"),
    ({"roles": {}}, "needs `roles: {role: model}`"),
    ({"world": None}, "needs `world:`"),
    ({"kind": "debate"}, "unknown workflow 'debate'; valid: .*hierarchy"),
    ({"alpha": -1}, "greater than or equal to 0"),
    ({"world_options": {"grid_imput": True}},
     "world_options {'grid_imput': True}: world 'plan_path' refuses them"),
    ({"world_options": {"grid_input": "yes"}}, "grid_input='yes' must be true or false"),
    ({"world": "plan_path_solo", "roles": {"plan": "m2"}, "world_options": {"grid_input": True}},
     "the single agent has no tool"),
])
def test_turn_team_mistakes_are_refused(change, message):
    data = _team()
    data["workflow"].update(change)
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("{", r"\{")):
        RunConfig.model_validate(data)


def test_turn_team_refuses_agents_a_flat_algorithm_and_filters():
    with pytest.raises(ValidationError, match="drop `agents`"):
        RunConfig.model_validate({**_team(), "agents": {"planner": "m1"}})
    with pytest.raises(ValidationError, match="tree sampling"):
        RunConfig.model_validate({**_team(), "algorithm": "mgrpo"})
    with pytest.raises(ValidationError, match="max_success"):
        RunConfig.model_validate({**_team(), "stages": [{"rounds": 1, "max_success": 0.5}]})
    with pytest.raises(ValidationError, match="hierarchy takes no world"):
        RunConfig.model_validate({"models": MODELS, "workflow": {"kind": "hierarchy",
                                                                 "world": "plan_path"}})


def test_a_registered_workflow_is_found_and_a_clash_refused():
    class Solo(Workflow):
        name = "solo_test_flow"

    solo = register_workflow(Solo())
    assert get_workflow("solo_test_flow") is solo and "solo_test_flow" in workflow_names()

    class Other(Workflow):
        name = "solo_test_flow"

    with pytest.raises(ValueError, match="already registered"):
        register_workflow(Other())


def test_benchmark_commands_refuse_a_turn_team_and_up_starts_its_services(tmp_path):
    from mgrpo.cli.up import service_commands
    from mgrpo.workflows import Workflow, refuse_embedded_only, refuse_outside_services

    refuse_embedded_only(RunConfig(models=MODELS), "mgrpo up")  # the hierarchy: fine
    with pytest.raises(ValueError, match="workflow turn_team trains with `mgrpo train` or "
                                         "the service entry points"):
        refuse_embedded_only(RunConfig.model_validate(_team()), "mgrpo data transcripts")
    path = tmp_path / "team.yaml"
    path.write_text("models: {m1: {path: unused}, m2: {path: unused}}\n"
                    "workflow: {kind: turn_team, world: sudoku4, roles: {tool: m1, plan: m2}}\n")
    commands = dict(service_commands(str(path), 8000))
    # the coordinator, one worker per role (no tool: the coordinator acts), one trainer per
    # model
    assert commands["planner-worker"] == ["serve", "planner-worker"]
    assert commands["subagent-tool"][:5] == ["serve", "subagent", "--name", "tool", "--model"]
    assert commands["subagent-tool"][5].endswith("unused") and len(commands["subagent-tool"]) == 6
    assert commands["subagent-plan"][:3] == ["serve", "subagent", "--name"]
    assert sorted(n for n in commands if n.startswith("trainer-")) == ["trainer-m1",
                                                                       "trainer-m2"]

    class Local(Workflow):  # a workflow the services do not run
        name = "local_only"

    cfg = RunConfig.model_validate(_team())
    refuse_outside_services(cfg)  # turn_team: fine
    with pytest.raises(ValueError, match="the services do not run workflow local_only"):
        refuse_outside_services(type("Cfg", (), {"flow": Local()})())
