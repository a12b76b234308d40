"""Typed rows the store returns and takes (pydantic), so callers never touch ORM objects.

What this module does NOT do: persistence (``mgrpo.store.store``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RoundStatus = Literal["pending", "running", "training", "done", "failed", "cancelled"]
TERMINAL_ROUND_STATUSES = frozenset({"done", "failed", "cancelled"})
RolloutStatus = Literal["pending", "running", "completed"]


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every datetime we store is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    @field_validator("*", mode="after")
    @classmethod
    def _utc(cls, value):
        return as_utc(value) if isinstance(value, datetime) else value


class QueryRecord(_Record):
    query_id: str
    question: str | None = None
    answer: str | None = None
    meta: dict = Field(default_factory=dict)


class RunRecord(_Record):
    run_id: str
    name: str
    status: str
    config: dict
    created_at: datetime


class RoundRecord(_Record):
    round_id: str
    run_id: str
    index: int
    k: int
    status: RoundStatus
    config: dict
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    published: bool = True  # every task of the round is on the broker


class RolloutRecord(_Record):
    round_id: str
    query_id: str
    rollout: int
    status: RolloutStatus
    attempts: int
    completed_attempt: int | None = None


class RoundProgress(_Record):
    total: int
    completed: int

    @property
    def done(self) -> bool:
        return self.total > 0 and self.completed == self.total


class PlannerOutcomeIn(_Record):
    """One planner score (docs/algorithm.md, '1.2 Rewards'): ``reward = a1*format + a2*correct`` if
    format_ok else 0."""

    query_id: str
    rollout: int = Field(ge=0)
    attempt: int = Field(ge=0)
    format_ok: bool
    correct: float = Field(ge=0.0, le=1.0)
    reward: float


class PlannerOutcomeRecord(PlannerOutcomeIn):
    round_id: str


class GroupStatIn(_Record):
    """Statistics of one advantage group: population mean/std of its n rewards (Eq. 6-13)."""

    group_key: str
    n: int = Field(ge=0)
    mean: float
    std: float = Field(ge=0.0)


class GroupStatRecord(GroupStatIn):
    round_id: str
    model: str
    agent: str
    published_by: str
    created_at: datetime


class DCount(_Record):
    """d_k: how many times rollout ``rollout`` of ``query_id`` called one sub-agent type, and
    (``invocations``, where the writer knows them) which calls were answered.

    ``attempt``: the attempt that played it. None when writing means "the attempt that
    completed the rollout" (for writers that record d_k after ``complete_rollout``, as the
    embedded loop does); readers always get it filled in.
    """

    query_id: str
    rollout: int = Field(ge=0)
    d: int = Field(ge=0)
    attempt: int | None = Field(None, ge=0)
    # which calls were answered (their invocation numbers); None: the count only
    invocations: list[Annotated[int, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _invocations_match_d(self) -> DCount:
        if self.invocations is not None and (len(set(self.invocations)) != self.d
                                             or len(self.invocations) != self.d):
            raise ValueError(f"d={self.d} but invocations {self.invocations} name "
                             f"{len(set(self.invocations))} distinct calls")
        return self


class CheckpointRecord(_Record):
    run_id: str = ""
    model: str
    version: int
    uri: str
    sha256: str
    round_id: str | None = None
    created_at: datetime


class AgentRecord(_Record):
    name: str
    tool: str | None
    description: str
    queue: str
    model: str
    registered_at: datetime
    heartbeat_at: datetime


class LeaseRecord(_Record):
    name: str
    holder: str
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    problem: str | None = None


EvaluationStatus = Literal["queued", "running", "done", "failed", "interrupted"]


class EvaluationJobRecord(_Record):
    evaluation_id: str
    status: EvaluationStatus
    owner: str
    request: dict
    n_questions: int
    played: int
    result: dict | None = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
