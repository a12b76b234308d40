"""The control plane's Celery tasks: their names, their queue and their typed payloads.

Control work is rare and each piece is a whole job (prune a run's old checkpoints, replay the
dead-letter queue, start or cancel a round, evaluate the planner): it runs as a Celery task,
one task per message, late-acked. Each task has its queue (:data:`QUEUE_OF_TASK`):
``mgrpo.control`` for the control worker (``mgrpo serve control``), ``mgrpo.evaluations``
for the planner API processes, which hold the planner's model. The high-rate trajectory path is
not here: it stays on the batching kombu consumers (``mgrpo.services.batching``).

Every task takes ONE argument, the JSON dict of its payload model; the worker validates it
with the model before anything runs (:func:`parse_payload`), so a malformed payload is refused
with the reason instead of being retried. Task names are stable constants, never derived from
module paths.

What this module does NOT do: run tasks (``mgrpo.services.control``) or talk to a broker.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationError

from mgrpo.validation import StrictModel

CONTROL_QUEUE = "mgrpo.control"
EVALUATIONS_QUEUE = "mgrpo.evaluations"

TASK_PRUNE_CHECKPOINTS = "mgrpo.control.prune_checkpoints"
TASK_REPLAY_DEAD_LETTERS = "mgrpo.control.replay_dead_letters"
TASK_ROUND = "mgrpo.control.round"
TASK_EVALUATE = "mgrpo.control.evaluate"

RunId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-][\w.\-]*$")]
ModelName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_\-]{0,62}$")]


class PruneCheckpoints(StrictModel):
    """Delete ``model``'s recorded checkpoints of ``run_id`` older than the newest ``keep``:
    the store records first, then the folders (``keep_checkpoints``). Idempotent: a second
    run finds nothing older to delete."""

    run_id: RunId
    model: ModelName
    keep: int = Field(ge=1, description="Versions kept (the newest ones); at least 1.")


class ReplayDeadLetters(StrictModel):
    """Publish dead letters back to the queue they came from (``mgrpo dlq replay``); only
    those from ``source`` (a full queue name) when given."""

    limit: int = Field(1000, ge=1, le=100_000)
    source: str | None = Field(None, min_length=1, max_length=255)


MAX_QUERIES_PER_ROUND = 4096
MAX_K = 64


class RoundSize(StrictModel):
    """How big a round is asked to be: the ONE model of these limits, for ``POST /v1/rounds``
    (``RoundIn``) and the control task (:class:`StartRound`). A value out of range is
    refused, never clamped; each curriculum stage's training pool bounds
    ``queries_per_round`` too (``mgrpo.services.rounds.check_round_size``)."""

    queries_per_round: int | None = Field(None, ge=1, le=MAX_QUERIES_PER_ROUND, description=(
        "B (default: config); at most each curriculum stage's training pool."))
    k: int | None = Field(None, ge=2, le=MAX_K, description="Rollouts per query (default: "
                          "config).")


class StartRound(RoundSize):
    """Start the next round of ``run_id`` (or round ``index``), as ``POST /v1/rounds`` does,
    with its limits (:class:`RoundSize`). With ``index`` it is idempotent: a round that exists
    already is left as it is."""

    command: Literal["start"]
    run_id: RunId | None = None
    index: int | None = Field(None, ge=0)


class CancelRound(StrictModel):
    """Cancel ``round_id`` (a finished round is left as it is)."""

    command: Literal["cancel"]
    round_id: str = Field(min_length=1, max_length=255)


class Evaluate(StrictModel):
    """Play and score the evaluation ``evaluation_id`` that ``POST /v1/evaluations`` recorded
    as queued (``split``, ``greedy``, ``n_questions``: its request). Idempotent: an evaluation
    that is no longer queued (running, or ended) is left as it is."""

    evaluation_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    n_questions: int = Field(ge=1, le=2000)
    split: Literal["train", "dev", "test"]
    greedy: bool


RoundCommandPayload = Annotated[StartRound | CancelRound, Field(discriminator="command")]

PAYLOADS: dict[str, object] = {
    TASK_PRUNE_CHECKPOINTS: PruneCheckpoints,
    TASK_REPLAY_DEAD_LETTERS: ReplayDeadLetters,
    TASK_ROUND: RoundCommandPayload,
    TASK_EVALUATE: Evaluate,
}
# The queue each task is sent to (without the deployment's prefix); the others: CONTROL_QUEUE.
QUEUE_OF_TASK: dict[str, str] = {TASK_EVALUATE: EVALUATIONS_QUEUE}
_ADAPTERS = {name: TypeAdapter(kind) for name, kind in PAYLOADS.items()}


class InvalidPayload(ValueError):
    """A control task's payload does not match its model: refused, never retried."""


def parse_payload(task: str, payload: object):
    """The typed payload of ``task``; :class:`InvalidPayload` with every problem named."""
    if task not in _ADAPTERS:
        raise InvalidPayload(f"unknown control task {task!r}; known: {sorted(_ADAPTERS)}")
    try:
        return _ADAPTERS[task].validate_python(payload)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}"
                             for e in error.errors())
        raise InvalidPayload(f"invalid {task} payload: {problems}") from error


def queue_of(task: str) -> str:
    """The queue ``task`` is sent to, without the deployment's prefix."""
    return QUEUE_OF_TASK.get(task, CONTROL_QUEUE)


def payload_dict(payload: StrictModel) -> dict:
    """The JSON dict a task is sent with."""
    return payload.model_dump(mode="json", exclude_none=True)
