"""``turn_team``: a team of roles takes turns on a :class:`~mgrpo.envs.worlds.World`
(AT-GRPO's setting): every team turn each role, in the world's order, observes its own
prompt (the task, its history, what the others produced) and acts. The episode ends when the
world says so (solved, or the world's own turn limit) or after ``workflow.max_turns`` team
turns. Team reward: the world's verifier (``World.score``) at the end of the team turn the
action starts (the later roles play one lookahead action each: ``mgrpo.training.team_play``);
local reward: the world's reward of the role's own action (``Turn.reward``); a turn's
training reward is ``alpha * team + local``.

The run config names the world and which model plays each role::

    workflow: {kind: turn_team, world: plan_path, roles: {tool: modelA, plan: modelB}}

``roles`` replaces ``agents`` (one model for both roles: a shared policy), and the algorithm
is ``at_grpo`` (tree sampling: ``mgrpo.training.team_play``) unless another tree algorithm
is named. Training in this process: ``mgrpo.training.team_round`` (the runner registered for
``turn_team`` in ``mgrpo.training.runners``); through the services: ``mgrpo.services.team``.
Evaluation (``mgrpo eval``, the same runner): the same greedy (or sampled) team ``mgrpo
train`` evaluates before and after, on any split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mgrpo.envs.worlds import World, build_world
from mgrpo.workflows.base import Workflow, register_workflow

if TYPE_CHECKING:
    from mgrpo.training.config import RunConfig


def world_for_run(cfg: RunConfig, sandbox: Any = None) -> World:
    """The run's world (``workflow.world``) built with its ``world_options``; tool code runs
    in ``sandbox`` when given (the sandbox service's client), else in the world's own
    in-process sandbox."""
    options = dict(cfg.workflow.world_options)
    if sandbox is not None:
        options["sandbox"] = sandbox
    return build_world(cfg.workflow.world, **options)


def world_roles(name: str) -> tuple[str, ...]:
    """The roles of registered world ``name``, in turn order (built with no options)."""
    return tuple(build_world(name).roles)


def check_world_options(name: str, options: dict) -> None:
    """Build world ``name`` with ``options`` once, so an option it does not take (a typo) or
    a value it refuses stops the config at load time, naming the option."""
    try:
        build_world(name, **options)
    except TypeError as error:  # an unexpected keyword: the constructor names it
        raise ValueError(f"workflow.world_options {options}: world {name!r} refuses them "
                         f"({error})") from None


class TurnTeam(Workflow):
    name = "turn_team"
    description = "roles take turns on a world, each observing and acting in order"
    team_reward = "the world's verifier on the episode (World.score, 1.0 solved)"
    local_reward = "the world's reward of the role's own action (Turn.reward)"
    reads_bench = False  # a world builds its own tasks from the seed
    evaluates = True  # mgrpo.training.runners: the team on its world's split
    distributed = True  # mgrpo.services.team: each role's turns sampled by its workers

    def prepare(self, data: dict) -> dict:
        flow = data["workflow"]
        roles = flow.get("roles")
        if not isinstance(roles, dict) or not roles:
            raise ValueError("workflow turn_team needs `roles: {role: model}` naming the model "
                             "of every role of its world")
        if "agents" in data and data["agents"] != roles:
            raise ValueError("workflow turn_team: each role's model comes from "
                             "workflow.roles; drop `agents`")
        return {**data, "agents": dict(roles), "algorithm": data.get("algorithm", "at_grpo")}

    def check(self, cfg) -> None:
        flow = cfg.workflow
        if cfg.delegation:
            raise ValueError(f"workflow turn_team: roles take turns; `calls` "
                             f"({cfg.delegation}) belong to the hierarchy")
        if not flow.world:
            raise ValueError("workflow turn_team needs `world:` (a registered world: "
                             "plan_path, sudoku4, or one a `plugins:` module registers)")
        roles = world_roles(flow.world)
        check_world_options(flow.world, flow.world_options)
        if sorted(flow.roles) != sorted(roles):
            raise ValueError(f"workflow.roles {sorted(flow.roles)} must name exactly the "
                             f"roles of world {flow.world!r}: {list(roles)}")
        filtered = [i for i, s in enumerate(cfg.stages) if s.max_success < 1.0]
        if filtered:
            raise ValueError(f"stages {filtered}: max_success filters a benchmark's questions; "
                             "a turn_team run samples its world's training tasks (drop it)")

    def roles(self, cfg) -> dict[str, str]:
        return dict(cfg.workflow.roles)

    def turn_order(self, cfg) -> dict[str, tuple[str, ...]]:
        order = world_roles(cfg.workflow.world)
        return {r: (order[(i + 1) % len(order)],) for i, r in enumerate(order)}

    def max_turns(self, cfg) -> int:
        if cfg.workflow.max_turns is not None:
            return cfg.workflow.max_turns

        return world_for_run(cfg).max_turns

    def alpha(self, cfg) -> float:
        alpha = cfg.workflow.alpha
        return cfg.at_grpo_alpha if alpha is None else alpha


TURN_TEAM = register_workflow(TurnTeam())
