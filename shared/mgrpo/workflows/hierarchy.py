"""``hierarchy``: a planner delegates subtasks to tool sub-agents and answers (M-GRPO's
shape). A thin declaration over what plays it: ``mgrpo.training.episodes`` (the episode
runner), ``mgrpo.training.tree`` (AT-GRPO's trees) and the loop of ``mgrpo.training.loop``;
the roles and their models are the run config's ``agents``."""

from __future__ import annotations

from mgrpo.workflows.base import Workflow, register_workflow
from mgrpo.workflows.config import WorkflowConfig


class Hierarchy(Workflow):
    name = "hierarchy"
    description = "a planner delegates subtasks to tool sub-agents, then answers"
    team_reward = "the verifier's verdict on the planner's final answer (rewards.planner)"
    local_reward = ("per algorithm: mgrpo - each sub-agent's r_expert and the main outcome "
                    "(rewards.subagent); at_grpo - each turn's own progress (training.tree)")
    embedded_only = False
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

    def turn_order(self, cfg) -> dict[str, tuple[str, ...]]:
        subs = tuple(r for r in cfg.agents if r != "planner")
        return {"planner": subs, **{r: ("planner",) for r in subs}}

    def max_turns(self, cfg) -> int:
        return cfg.sampling.planner_max_turns

    def train(self, cfg, resume, progress, stop_after, log_every):
        from mgrpo.training.loop import run_hierarchy

        return run_hierarchy(cfg, resume, progress, stop_after, log_every)


HIERARCHY = register_workflow(Hierarchy())
