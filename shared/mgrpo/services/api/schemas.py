"""Input and output models of the REST API (separate from the store's records)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from mgrpo.bus.control import RoundSize
from mgrpo.store.records import AgentRecord
from mgrpo.training.config import InitFrom
from mgrpo.validation import StrictModel

NAME_MAX = 80
ID_MAX = 100
MAX_AGE_S = 10 * 365 * 24 * 3600  # 10 years: beyond that a date overflows, and means nothing


def _name_of(kind: str, max_length: int):
    """A validator for names (run, round, model): a name, never a path or free text."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")

    def check(value: str) -> str:
        if not value or len(value) > max_length or not value[0].isascii() \
                or not value[0].isalnum() or not set(value) <= allowed:
            raise ValueError(f"a {kind} is a name of 1-{max_length} characters: letters, "
                             "digits, '_', '.', '-', starting with a letter or digit (not a "
                             "path, no spaces or control characters)")
        return value
    return AfterValidator(check)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


RunId = Annotated[str, _name_of("run id", NAME_MAX)]
RoundId = Annotated[str, _name_of("round id", ID_MAX)]
ModelName = Annotated[str, _name_of("model name", NAME_MAX)]
Text = Annotated[str, AfterValidator(_no_nul)]


class _In(StrictModel):
    """Request bodies refuse unknown fields, naming the nearest valid one."""


class ErrorOut(BaseModel):
    detail: str = Field(description="What went wrong and what to do about it.")


def errors(*codes: int) -> dict:
    """OpenAPI ``responses`` for the refusals a route can give (every code it can return is
    documented: the schemathesis test checks it)."""
    why = {400: "The body is not valid JSON (e.g. not UTF-8)",
           401: "No bearer token (Authorization: Bearer <MGRPO_API_TOKEN>)",
           403: "Wrong token, or mutating endpoints disabled (no token configured)",
           404: "No such round or evaluation",
           409: "A round of this run is still in progress, or no live worker serves a "
                "role the round needs (a sub-agent, a trainer; embedded: no worker of this "
                "process serves its sub-agents)",
           413: "Request body larger than MGRPO_MAX_BODY_BYTES",
           429: "Too many requests in flight (or an evaluation already running); retry "
                "after Retry-After seconds"}
    return {code: {"model": ErrorOut, "description": why[code]} for code in codes}


class QueryIn(_In):
    question: Text = Field(min_length=1, max_length=4000, description="The question to answer.")
    greedy: bool = Field(True, description="Greedy decoding (else sampled, T from the config).")


class QueryOut(BaseModel):
    answer: str | None
    format_ok: bool
    trace: list[dict[str, Any]] = Field(description="Delegations, sub-agent tool calls and "
                                        "results, and the final answer, in order.")
    weights_version: int
    tokens: int = Field(description="Planner tokens generated.")


class RoundIn(RoundSize):
    """A round to start. `queries_per_round` and `k` out of range are refused (422), never
    clamped; `mgrpo.control.round` start tasks have the same limits."""

    run_id: RunId | None = Field(None, description="Run to add the round to (default: "
                                 "config name).")
    init_from: InitFrom | None = Field(
        None, description="Start a NEW run from another run's checkpoints (default: the "
        "config's init_from, else each model's folder). Never implicit.")


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
    weights_version: int = Field(description="The newest planner weights version any of its "
                                 "episodes used (weights are refreshed before each batch).")


class EvaluationJobOut(BaseModel):
    evaluation_id: str
    status: Literal["queued", "running", "done", "failed", "interrupted"] = Field(
        description="queued: sent to the evaluation workers (MGRPO_EVALUATION_QUEUE), not "
        "taken yet; interrupted: the API process that ran it stopped before it ended (error "
        "says so); start it again.")
    split: Literal["train", "dev", "test"]
    greedy: bool
    n_questions: int = Field(description="Questions in this evaluation (at most the "
                             "requested number: the split may have fewer).")
    played: int = Field(description="Episodes played so far.")
    result: EvaluationOut | None = Field(None, description="Once status is done.")
    error: str | None = Field(None, description="Once status is failed or interrupted: why.")
    created_at: datetime
    finished_at: datetime | None = None


# The store's registry row as the API answers it: the same fields, under the OpenAPI schema
# name AgentOut (no docstring: it would become the schema's description).
class AgentOut(AgentRecord):
    pass


class CheckpointOut(BaseModel):
    run_id: str
    model: str
    version: int
    uri: str
    sha256: str
    round_id: str | None = None
    created_at: datetime
