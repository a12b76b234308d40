"""``hierarchy``: a planner delegates subtasks to tool sub-agents and answers (M-GRPO's
shape). A declaration; what plays it is ``mgrpo.training``'s (its runner, registered in
``mgrpo.training.runners``: the run of ``mgrpo.training.hierarchy_run`` over the episode
runner ``mgrpo.training.episodes`` and AT-GRPO's trees ``mgrpo.training.tree``, and the
held-out evaluation of ``mgrpo.training.heldout``); the roles and their models are the run
config's ``agents``.

The hierarchy may nest: a sub-agent that delegates lists the sub-agents it may call
(``agents: {researcher: {model: r, calls: [searcher]}}``, held in ``RunConfig.delegation``).
:func:`delegation_tree` is the graph every part reads (the planner's callees default to the
sub-agents no other agent calls); it is a tree rooted at the planner, at most
:data:`MAX_DEPTH` levels of sub-agents deep. Every agent at every level is trained with
M-GRPO's per-agent groups (each role's group: its own calls of a query, aligned to d slots
per rollout). Nested delegation is played in this process (``mgrpo train``, ``mgrpo eval``)
and through the services (a sub-agent worker that delegates sends its own calls over the
bus, ``mgrpo.services.subagent.worker``)."""

from __future__ import annotations

from mgrpo.workflows.base import Workflow, register_workflow
from mgrpo.workflows.config import WorkflowConfig

MAX_DEPTH = 4  # levels of sub-agents below the planner


def delegation_tree(agents, delegation: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    """Every role -> the sub-agents it may call, the planner's included (default: the
    sub-agents no other agent calls, in ``agents`` order). A one-line ValueError for a
    callee that is not a sub-agent role, a role calling itself, a cycle, a sub-agent with
    two callers or none, or a tree deeper than :data:`MAX_DEPTH`."""
    subs = [r for r in agents if r != "planner"]
    for role, callees in delegation.items():
        if role not in agents:
            raise ValueError(f"agents: {role!r} lists calls but is not a role of `agents` "
                             f"({sorted(agents)})")
        for callee in callees:
            if callee == role:
                raise ValueError(f"agents.{role}.calls lists {role} itself: an agent "
                                 "delegates to other agents only")
            if callee not in subs:
                raise ValueError(f"agents.{role}.calls: {callee!r} is not a sub-agent role "
                                 f"of `agents` ({sorted(subs)})")
    for start in delegation:  # a cycle: follow the calls back to where they started
        path, seen = [start], {start}
        cycle = _find_cycle(start, delegation, path, seen)
        if cycle:
            raise ValueError(f"agents: delegation cycle {' -> '.join(cycle)}; the agents "
                             "that call each other must form a tree under the planner")
    called = [c for r, cs in delegation.items() if r != "planner" for c in cs]
    tree = {r: tuple(dict.fromkeys(delegation.get(r, ()))) for r in agents}
    if "planner" not in delegation:
        tree["planner"] = tuple(r for r in subs if r not in called)
    callers: dict[str, list[str]] = {}
    for role, callees in tree.items():
        for callee in callees:
            callers.setdefault(callee, []).append(role)
    for role in subs:
        who = callers.get(role, [])
        if len(who) > 1:
            raise ValueError(f"agents: {role} is called by {' and '.join(who)}; each "
                             "sub-agent has one caller (its group is its caller's calls)")
        if not who:
            raise ValueError(f"agents: no agent calls {role} (the planner lists its own "
                             f"calls: {list(tree['planner'])}); add it to one agent's calls")
    depth = _depth(tree, "planner")
    if depth > MAX_DEPTH:
        raise ValueError(f"agents: delegation {depth} levels below the planner; at most "
                         f"{MAX_DEPTH}")
    return tree


def _find_cycle(role: str, delegation: dict[str, list[str]], path: list[str],
                seen: set[str]) -> list[str] | None:
    for callee in delegation.get(role, ()):
        if callee == path[0]:
            return [*path, callee]
        if callee not in seen:
            seen.add(callee)
            found = _find_cycle(callee, delegation, [*path, callee], seen)
            if found:
                return found
    return None


def _depth(tree: dict[str, tuple[str, ...]], role: str) -> int:
    return max((1 + _depth(tree, c) for c in tree.get(role, ())), default=0)


class Hierarchy(Workflow):
    name = "hierarchy"
    description = "a planner delegates subtasks to tool sub-agents, then answers"
    team_reward = "the verifier's verdict on the planner's final answer (rewards.planner)"
    local_reward = ("per algorithm: mgrpo - each sub-agent's r_expert and the main outcome "
                    "(rewards.subagent); at_grpo - each turn's own progress (training.tree)")
    embedded_only = False
    evaluates = True  # mgrpo.training.runners: evaluate_hierarchy
    distributed = True

    def prepare(self, data: dict) -> dict:
        flow = data.get("workflow") or {}
        defaults = WorkflowConfig().model_dump()
        extra = sorted(k for k, v in flow.items() if k != "kind" and v != defaults.get(k, v))
        if extra:
            raise ValueError(f"workflow hierarchy takes no {', '.join(extra)} (its roles are "
                             "`agents`); those are settings of kind: turn_team")
        return data

    def check(self, cfg) -> None:
        if "planner" not in cfg.agents:
            raise ValueError("`agents` must map the role `planner` to a model.")
        tree = delegation_tree(cfg.agents, cfg.delegation)
        nested = {r: list(cs) for r, cs in tree.items() if r != "planner" and cs}
        if not nested:
            return
        if cfg.protocol.format != "markup":
            raise ValueError(f"agents {nested}: nested delegation renders the markup only "
                             "(protocol.format: markup)")

    def turn_order(self, cfg) -> dict[str, tuple[str, ...]]:
        tree = delegation_tree(cfg.agents, cfg.delegation)
        caller = {c: r for r, cs in tree.items() for c in cs}
        return {r: (*cs, *((caller[r],) if r in caller else ())) for r, cs in tree.items()}

    def max_turns(self, cfg) -> int:
        return cfg.sampling.planner_max_turns


HIERARCHY = register_workflow(Hierarchy())
