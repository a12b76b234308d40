"""Message schemas: round trip, idempotency keys, refusals with reasons."""

from __future__ import annotations

import json
import pickle

import pytest

from mgrpo.bus.messages import (
    EpisodeTask,
    MessageDecodeError,
    RoundCommand,
    TrajectoryMessage,
    WeightsAnnouncement,
    decode_message,
    encode_message,
)
from mgrpo.bus.names import subagent_queue, trainer_queue
from mgrpo.types import Trajectory


def traj() -> Trajectory:
    return Trajectory(traj_id="r/q/0/planner/0", attempt=2, round_id="r", query_id="q",
                      rollout=0, agent="planner", model="planner", input_ids=[5, 6, 7],
                      response_mask=[0, 1, 1], old_logprobs=[0.0, -0.25, -1.5])


@pytest.mark.parametrize("message", [
    EpisodeTask(run_id="run", round_id="r", query_id="q", rollout=3, attempt=1),
    TrajectoryMessage(trajectory=traj()),
    WeightsAnnouncement(model="planner", version=4, uri="file:///c/4", sha256="f" * 64),
    RoundCommand(command="train", run_id="run", round_id="r", model="searcher"),
])
def test_round_trip_through_json_text(message):
    wire = json.dumps(encode_message(message))
    assert decode_message(wire.encode()) == message
    assert decode_message(json.loads(wire)) == message


def test_idempotency_key_is_logical_not_per_send():
    first, resend = TrajectoryMessage(trajectory=traj()), TrajectoryMessage(trajectory=traj())
    assert first.message_id != resend.message_id
    assert first.idempotency_key == resend.idempotency_key == "trajectory:r/q/0/planner/0/2"
    other_attempt = TrajectoryMessage(trajectory=traj().model_copy(update={"attempt": 3}))
    assert other_attempt.idempotency_key != first.idempotency_key


@pytest.mark.parametrize("payload, reason", [
    (b"\xff\xfe", "not UTF-8"),
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON list"),
    ({"kind": "nope"}, "kind"),
    ({"kind": "weights", "schema_version": 2, "model": "m", "version": 1, "uri": "u",
      "sha256": "f" * 64}, "schema_version"),
    ({"kind": "episode_task", "run_id": "r", "round_id": "r", "query_id": "q", "rollout": -1},
     "rollout"),
    (pickle.dumps({"kind": "weights"}), "not"),
])
def test_bad_payloads_are_refused_with_a_reason(payload, reason):
    with pytest.raises(MessageDecodeError) as info:
        decode_message(payload)
    assert reason in info.value.reason


def test_extra_fields_are_refused():
    data = encode_message(RoundCommand(command="start", run_id="run", round_id="r"))
    data["surprise"] = 1
    with pytest.raises(MessageDecodeError, match="surprise"):
        decode_message(data)


def test_queue_names_and_their_rule():
    assert trainer_queue("planner") == "trainer.planner"
    assert subagent_queue("searcher") == "subagent.searcher"
    with pytest.raises(ValueError, match="must match"):
        trainer_queue("Bad Name")


HOSTILE_NESTING = b'{"kind":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize("payload", [HOSTILE_NESTING, HOSTILE_NESTING.decode()])
def test_deep_nesting_is_a_decode_error_not_a_recursion_error(payload):
    with pytest.raises(MessageDecodeError, match="nests 100001 levels deep"):
        decode_message(payload)


def test_oversized_body_is_refused_before_parsing(monkeypatch):
    import mgrpo.bus.messages as messages

    monkeypatch.setattr(messages, "MAX_MESSAGE_BYTES", 1000)
    with pytest.raises(MessageDecodeError, match="over the limit of 1000"):
        decode_message(b'{"kind": "trajectory", "pad": "' + b"x" * 2000 + b'"}')


def test_brackets_inside_strings_do_not_count_as_nesting():
    from mgrpo.bus.messages import nesting_depth

    assert nesting_depth(b'{"a": [1, {"b": "[[[[\\"]]]{{"}]}') == 3
    message = RoundCommand(command="train", run_id="[" * 500, round_id="{" * 500)
    assert decode_message(json.dumps(encode_message(message))) == message


def test_any_exception_while_decoding_is_a_decode_error(monkeypatch):
    import mgrpo.bus.messages as messages

    def explode(payload):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(messages, "_decode", explode)
    with pytest.raises(MessageDecodeError, match="RecursionError"):
        decode_message(b'{"kind": "trajectory"}')


def test_a_subagent_call_with_an_overlong_subtask_is_refused():
    wire = {"kind": "subagent_call", "call_id": "r/q/0/coder/0", "agent": "coder",
            "reply_to": "planner.replies.w", "subtask": "x" * 26_000}
    with pytest.raises(MessageDecodeError, match="subtask: String should have at most"):
        decode_message(json.dumps(wire))
    from mgrpo.bus.messages import MAX_SUBTASK_CHARS

    wire["subtask"] = "x" * MAX_SUBTASK_CHARS
    assert decode_message(json.dumps(wire)).subtask == wire["subtask"]
