"""The run config's ``workflow:`` section (:class:`WorkflowConfig`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mgrpo.validation import StrictModel


class WorkflowConfig(StrictModel):
    """Which workflow a run trains (``mgrpo.workflows``) and its settings. Absent: the
    ``hierarchy`` (a planner delegating to the sub-agents of ``agents``)."""

    kind: str = Field("hierarchy", description="A registered workflow: hierarchy, turn_team, "
                      "or one a `plugins:` module registers.")
    world: str | None = Field(None, description="turn_team: the registered world the team "
                              "plays (plan_path, sudoku4, or a plug-in's).")
    roles: dict[str, str] = Field(
        default_factory=dict, description="turn_team: role -> the entry of `models` that "
        "plays it (every role of the world; one model for all roles = a shared policy). "
        "Replaces `agents`.")
    alpha: float | None = Field(None, ge=0, description="turn_team: the turn reward "
                                "alpha * team + local (None: at_grpo_alpha).")
    grouping: Literal["agent_turn", "agent", "turn", "naive"] = Field(
        "agent_turn", description="turn_team: the advantage groups of K candidates - "
        "agent_turn (AT-GRPO: each (task, role, team turn)), agent (a role's turns pooled), "
        "turn (a turn's roles pooled, when one model plays them), naive (all of a task's "
        "samples of a model in one group).")
    max_turns: int | None = Field(None, ge=1, description="turn_team: team turns per "
                                  "episode at most (None: the world's own limit).")
    world_options: dict[str, Any] = Field(
        default_factory=dict, description="turn_team: keywords of the world's constructor, "
        "e.g. {size: 6} for plan_path.")
    train_tasks: int = Field(1000, ge=1, description="turn_team: the training split's "
                             "tasks a run samples its rounds from (held-out: "
                             "eval_questions of the test split).")
