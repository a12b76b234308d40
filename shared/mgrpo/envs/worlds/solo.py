"""``plan_path_solo``: Plan-Path played by one agent (AT-GRPO's single-agent baseline).

The ``plan`` role alone answers the moves from the grid, with no tool agent and no tool
output to read; tasks, splits, verifier, rewards and turn limit are ``plan_path``'s, so a
solo run and a tool + plan team are evaluated on the same held-out tasks.
"""

from __future__ import annotations

from mgrpo.envs.worlds.base import WorldState, register_world
from mgrpo.envs.worlds.plan_path import PlanPath


@register_world("plan_path_solo")
class PlanPathSolo(PlanPath):
    name = "plan_path"  # the same task ids and splits as the team's world
    roles = ("plan",)

    def __init__(self, grid_input: bool = False, **kw):
        if grid_input:
            raise ValueError("plan_path_solo: grid_input gives the tool agent's program the "
                             "grid; the single agent has no tool (drop it)")
        super().__init__(**kw)

    def observe(self, state: WorldState, role: str) -> str:
        d = state.data
        lines = [state.task.statement]
        if d["answer"]:
            lines.append(f"Your last answer: {d['answer']} ({d['feedback']})")
        lines.append(f"You are the plan agent: give {self.answer_help} as <answer>...</answer>.")
        return "\n".join(lines) + "\n"
