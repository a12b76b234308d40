"""Input and output models of the REST API (separate from the store's records)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from mgrpo.validation import StrictModel


class _In(StrictModel):
    """Request bodies refuse unknown fields, naming the nearest valid one."""


class QueryIn(_In):
    question: str = Field(min_length=1, max_length=4000, description="The question to answer.")
    greedy: bool = Field(True, description="Greedy decoding (else sampled, T from the config).")


class QueryOut(BaseModel):
    answer: str | None
    format_ok: bool
    trace: list[dict[str, Any]] = Field(description="Delegations, sub-agent tool calls and "
                                        "results, and the final answer, in order.")
    weights_version: int
    tokens: int = Field(description="Planner tokens generated.")


class RoundIn(_In):
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,80}$",
                               description="Run to add the round to (default: config name).")
    queries_per_round: int | None = Field(None, ge=1, le=4096, description="B (default: config).")
    k: int | None = Field(None, ge=2, le=64, description="Rollouts per query (default: config).")


class RoundOut(BaseModel):
    round_id: str
    run_id: str
    index: int
    k: int
    status: str
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    rollouts: dict[str, int] | None = None
    trained_models: list[str] = []
    published_models: list[str] = []
    trajectories: dict[str, int] = {}
    metrics: dict[str, float] = {}


class EvaluationIn(_In):
    n_questions: int = Field(20, ge=1, le=2000)
    split: Literal["train", "dev", "test"] = "test"
    greedy: bool = True


class EvaluationOut(BaseModel):
    n: int
    accuracy: float
    format_valid: float
    weights_version: int


class AgentOut(BaseModel):
    name: str
    tool: str | None
    description: str
    queue: str
    model: str
    registered_at: datetime
    heartbeat_at: datetime


class CheckpointOut(BaseModel):
    model: str
    version: int
    uri: str
    sha256: str
    round_id: str | None = None
    created_at: datetime
