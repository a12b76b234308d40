"""Versioned message schemas of the bus (docs/messages.md, 'Messages'): JSON only, ids and
tokens, never pickles.

Every message has ``kind`` (the discriminator), ``schema_version``, ``message_id`` (unique
per send) and ``idempotency_key`` (the same for every send of the same logical message: a
re-published duplicate has a new message_id but the same key; consumers dedupe on the key).
:func:`decode_message` parses any of them with one ``TypeAdapter`` over the discriminated
union and raises :class:`MessageDecodeError` with a reason that goes to the dead-letter queue.

Ids (every ``*_id``, keys, names, queues, a trajectory's ids) must not contain a NUL byte:
PostgreSQL cannot store one, so such a message could never be handled; it is refused here,
as malformed, and goes to the dead-letter queue alone instead of failing in the store.

Hostile bodies are bounded BEFORE any parser sees them: a body over
:data:`MAX_MESSAGE_BYTES`, or nested deeper than :data:`MAX_NESTING_DEPTH` (arrays and objects
inside each other; a real message nests a few levels), is refused with the reason. And any
exception while decoding, whatever its type, becomes a :class:`MessageDecodeError`: a decode
never raises anything a consumer could take for a lost connection.

Bumping a schema: add a new model with ``schema_version: Literal[2]`` and keep decoding 1
until no producer sends it; unknown versions are refused (not guessed).

What this module does NOT do: send or receive (``mgrpo.bus.transport``, ``kombu_bus``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from mgrpo.types import Trajectory


def new_message_id() -> str:
    return uuid.uuid4().hex


# Fields that are identifiers (stored as keys, used in queue names): no NUL byte allowed.
ID_FIELDS = ("message_id", "idempotency_key", "run_id", "round_id", "query_id", "call_id",
             "agent", "reply_to", "model", "uri", "sha256", "command", "group")
TRAJECTORY_ID_FIELDS = ("traj_id", "round_id", "query_id", "agent", "model")


def _no_nul(owner: str, names: tuple[str, ...], values) -> None:
    for name in names:
        value = getattr(values, name, None)
        if isinstance(value, str) and "\x00" in value:
            raise ValueError(f"{owner}{name} contains a NUL byte (\\x00); ids must be text "
                             "PostgreSQL can store")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    message_id: str = Field(default_factory=new_message_id)
    idempotency_key: str = ""

    def default_key(self) -> str:  # overridden: what makes two sends the same message
        return self.message_id

    @model_validator(mode="after")
    def _fill_key(self):
        _no_nul("", ID_FIELDS, self)
        trajectory = getattr(self, "trajectory", None)
        if trajectory is not None:
            _no_nul("trajectory.", TRAJECTORY_ID_FIELDS, trajectory)
        if not self.idempotency_key:
            object.__setattr__(self, "idempotency_key", f"{self.kind}:{self.default_key()}")
        return self


class _Grouped(_Message):
    """A message sent together with others: ``group`` names the send (a round, a planner's
    delegation turn) and ``group_size`` says how many messages it holds, so a batch consumer
    can start the moment it holds them all instead of waiting for more (0: unknown)."""

    group: str = ""
    group_size: int = Field(0, ge=0)


class EpisodeTask(_Grouped):
    """Run one attempt of one rollout (planner workers)."""

    kind: Literal["episode_task"] = "episode_task"
    run_id: str
    round_id: str
    query_id: str
    rollout: int = Field(ge=0)
    attempt: int = Field(0, ge=0)
    weights_version: int = Field(0, ge=0)
    greedy: bool = False

    def default_key(self) -> str:
        return f"{self.round_id}/{self.query_id}/{self.rollout}/{self.attempt}"


class TreeBranching(BaseModel):
    """AT-GRPO: play a delegation as a tree (``mgrpo.training.tree``): K candidates per turn
    from the same state, the call continued from the best one."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(ge=1, le=64)
    first_turn: int = Field(0, ge=0)  # this agent's decisions earlier in the episode
    seed: int  # the round's tree seed (``tree_round.tree_seed``)
    # per candidate slot: the attempt its trajectories carry; None: slot already complete
    attempts: list[int | None]


class TurnRequest(BaseModel):
    """One generation request of a turn-team turn (``mgrpo.engines.base.GenerationRequest``
    as JSON): a role's prompt and one candidate's sampling settings."""

    model_config = ConfigDict(extra="forbid")
    prompt_ids: list[int]
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = Field(64, ge=1)
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None


class TurnCompletion(BaseModel):
    """What the role's worker sampled for one :class:`TurnRequest`
    (``mgrpo.engines.base.Completion`` less the prompt)."""

    model_config = ConfigDict(extra="forbid")
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]


# A delegation's subtask is written by an agent within a turn's max_new_tokens; the bound
# (twice the longest REST question, 4,000) keeps one hostile call from sizing a sub-agent's
# prompt, and so its trainer's update.
MAX_SUBTASK_CHARS = 8000


class SubAgentCall(_Grouped):
    """A delegation to a sub-agent (by the planner, or by a sub-agent that delegates); the
    answer goes to ``reply_to``. ``subtask`` holds at most :data:`MAX_SUBTASK_CHARS`."""

    kind: Literal["subagent_call"] = "subagent_call"
    call_id: str  # the sub-agent trajectory's traj_id (round/query/rollout/agent/invocation)
    round_id: str | None = None  # None outside training (a REST query)
    query_id: str | None = None
    rollout: int = Field(0, ge=0)
    attempt: int = Field(0, ge=0)
    agent: str
    invocation: int = Field(0, ge=0)
    subtask: str = Field(max_length=MAX_SUBTASK_CHARS)
    reply_to: str
    weights_version: int = Field(0, ge=0)
    tree: TreeBranching | None = None  # AT-GRPO rounds: K continuations at each turn
    # turn_team rounds: sample these (one role's team turn: K candidates per live task);
    # ``subtask`` is then empty
    turn: list[TurnRequest] | None = None
    # the sampling seed the caller derived for this call (``SubagentCall.seed``); None: the
    # worker derives it from the round and the call (tree calls, older producers)
    seed: int | None = Field(None, ge=0)

    def default_key(self) -> str:
        return f"{self.call_id}/{self.attempt}"


class SubAgentResult(_Message):
    kind: Literal["subagent_result"] = "subagent_result"
    call_id: str
    attempt: int = Field(0, ge=0)
    agent: str
    result: str
    format_ok: bool
    trace: list[dict[str, Any]] = Field(default_factory=list)  # tool calls, for the REST trace
    error: str | None = None
    turns: int = Field(0, ge=0)  # tree calls: the decisions (turns) the call took
    solved: bool = False  # tree calls: the result judged right (r_expert)
    completions: list[TurnCompletion] = Field(default_factory=list)  # turn calls, in order
    weights_version: int = Field(0, ge=0)  # turn calls: the weights that sampled them

    def default_key(self) -> str:
        return f"{self.call_id}/{self.attempt}"


class TrajectoryMessage(_Message):
    """One trajectory (ids + tokens) for its own model's trainer (``trainer.<model>``)."""

    kind: Literal["trajectory"] = "trajectory"
    trajectory: Trajectory

    def default_key(self) -> str:
        return f"{self.trajectory.traj_id}/{self.trajectory.attempt}"


class WeightsAnnouncement(_Message):
    """Fanout on ``mgrpo.weights``: ``model`` has a new checkpoint ``version`` at ``uri``."""

    kind: Literal["weights"] = "weights"
    model: str
    version: int = Field(ge=0)
    uri: str
    sha256: str = Field(min_length=64, max_length=64)
    round_id: str | None = None

    def default_key(self) -> str:  # versions are per run: the round tells runs apart
        return f"{self.model}/{self.version}/{self.round_id or '-'}"


class RoundCommand(_Message):
    """Round control: start a round, tell trainers its rollouts are in, or cancel it."""

    kind: Literal["round_command"] = "round_command"
    command: Literal["start", "train", "cancel"]
    run_id: str
    round_id: str
    model: str | None = None  # "train": the trainer it is for; None: every trainer

    def default_key(self) -> str:
        return f"{self.round_id}/{self.command}/{self.model or '*'}"


Message = Annotated[
    EpisodeTask | SubAgentCall | SubAgentResult | TrajectoryMessage | WeightsAnnouncement
    | RoundCommand,
    Field(discriminator="kind"),
]
MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
MESSAGE_KINDS = ("episode_task", "subagent_call", "subagent_result", "trajectory", "weights",
                 "round_command")


# Bounds checked before decoding. A trajectory of 32k tokens is ~1 MB of JSON; the broker's own
# default limit (RabbitMQ ``max_message_size``) is 128 MiB.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Our messages nest at most ~5 levels (a call's trace of tool events, a turn's requests); the
# bound leaves room for tool payloads in a trace and stays far below any parser's recursion.
MAX_NESTING_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(body: bytes) -> int:
    """How deep arrays and objects nest in a JSON ``body`` (brackets inside strings do not
    count). Linear in the body, no recursion: safe on any input."""
    skeleton = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in skeleton:
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


class MessageDecodeError(ValueError):
    """A payload that is not a valid message; ``reason`` says why (kept in the dead letter)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_message(message: _Message) -> dict:
    """The JSON-ready dict of a message (what goes on the wire)."""
    return message.model_dump(mode="json")


def decode_message(payload: bytes | str | dict) -> Message:
    """Parse a wire payload (JSON bytes/str or an already-decoded dict) into a message.

    Raises :class:`MessageDecodeError` (with the reason) and nothing else."""
    try:
        if isinstance(payload, bytes | bytearray | str):
            _check_bounds(payload.encode("utf-8", "surrogatepass")
                          if isinstance(payload, str) else bytes(payload))
        return _decode(payload)
    except MessageDecodeError:
        raise
    except Exception as error:  # noqa: BLE001 - RecursionError, MemoryError's kin, parser bugs
        raise MessageDecodeError(f"payload could not be decoded: {type(error).__name__}: "
                                 f"{error}"[:2000]) from error


def _check_bounds(body: bytes) -> None:
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageDecodeError(f"payload is {len(body)} bytes, over the limit of "
                                 f"{MAX_MESSAGE_BYTES} (MAX_MESSAGE_BYTES)")
    depth = nesting_depth(body)
    if depth > MAX_NESTING_DEPTH:
        raise MessageDecodeError(f"payload nests {depth} levels deep, over the limit of "
                                 f"{MAX_NESTING_DEPTH} (MAX_NESTING_DEPTH)")


def _decode(payload: bytes | str | dict) -> Message:
    if isinstance(payload, bytes | bytearray | str):
        try:  # the common case in one pass of pydantic's own JSON parser (no json.loads)
            return MESSAGE_ADAPTER.validate_json(payload)
        except ValidationError:
            pass  # below: the same checks again, to say why
    if isinstance(payload, bytes | bytearray):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError as error:
            raise MessageDecodeError(f"payload is not UTF-8 JSON: {error}") from error
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError as error:
            raise MessageDecodeError(f"payload is not JSON: {error}") from error
    if not isinstance(payload, dict):
        raise MessageDecodeError(f"payload is a JSON {type(payload).__name__}, expected an "
                                 f"object with 'kind' in {MESSAGE_KINDS}")
    try:
        return MESSAGE_ADAPTER.validate_python(payload)
    except ValidationError as error:
        details = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                            for e in error.errors()[:5])
        raise MessageDecodeError(f"invalid {payload.get('kind', '<no kind>')!r} message: "
                                 f"{details}") from error
