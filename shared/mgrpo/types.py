"""Records shared by the episode runner, the trainers, the store and the bus.

A trajectory is one agent's token sequence for one invocation: the planner's whole episode,
or one sub-agent call. Its id is deterministic, so a re-run attempt of the same rollout upserts
instead of duplicating.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


def trajectory_id(round_id: str, query_id: str, rollout: int, agent: str, invocation: int) -> str:
    """Deterministic id: the same logical trajectory always has the same id."""
    return f"{round_id}/{query_id}/{rollout}/{agent}/{invocation}"


class Trajectory(BaseModel):
    traj_id: str
    attempt: int = 0
    round_id: str
    query_id: str
    rollout: int = Field(ge=0)
    agent: str  # role: planner, searcher, coder ...
    model: str  # the model (trainer) this trajectory belongs to
    invocation: int = Field(0, ge=0)  # 0 for the planner; i-th call of this sub-agent
    weights_version: int = 0
    turn: int | None = None  # AT-GRPO: the turn this candidate action was sampled at
    input_ids: list[int]  # prompt + generated + observations, in order
    response_mask: list[int]  # 1 on tokens the agent generated, else 0; len == len(input_ids)
    old_logprobs: list[float]  # behaviour logprob per token, 0.0 where response_mask == 0
    format_ok: bool = True
    subtask: str | None = None  # sub-agents: the task they were given
    result: str | None = None  # sub-agents: what they returned; planner: the final answer
    reward: float | None = None  # filled by the trainer side
    extra: dict = Field(default_factory=dict)
