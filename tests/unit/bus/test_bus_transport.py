"""The decode -> dedupe -> handle -> done helper and the in-memory bus (embedded mode)."""

from __future__ import annotations

import threading

import pytest

from mgrpo.bus import InMemoryBus, MemoryDedupe, process_payload
from mgrpo.bus.messages import RoundCommand, WeightsAnnouncement, encode_message
from mgrpo.store import Store


def command(round_id="r0") -> RoundCommand:
    return RoundCommand(command="start", run_id="run", round_id=round_id)


def test_process_payload_runs_once_per_key_and_consumer():
    seen: list[str] = []
    dedupe = MemoryDedupe()
    payload = encode_message(command())
    assert process_payload(payload, lambda m: seen.append(m.round_id), dedupe=dedupe,
                           consumer="a").status == "done"
    resent = encode_message(command())  # new message_id, same logical message
    assert process_payload(resent, seen.append, dedupe=dedupe, consumer="a").status == "duplicate"
    assert process_payload(payload, lambda m: seen.append("b"), dedupe=dedupe,
                           consumer="b").status == "done"
    assert seen == ["r0", "b"]


def test_failed_handler_is_dead_lettered_and_not_claimed():
    dedupe = MemoryDedupe()

    def boom(message) -> None:
        raise RuntimeError("disk full")

    outcome = process_payload(encode_message(command()), boom, dedupe=dedupe, consumer="t")
    assert outcome.status == "dead_letter"
    assert "RuntimeError: disk full" in outcome.reason
    # not claimed: a later redelivery runs the handler again
    assert process_payload(encode_message(command()), lambda m: None, dedupe=dedupe,
                           consumer="t").status == "done"


def test_store_is_a_dedupe(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    store.upgrade()
    calls: list[int] = []
    for _ in range(3):
        process_payload(encode_message(command()), lambda m: calls.append(1), dedupe=store,
                        consumer="trainer.planner")
    assert calls == [1]
    assert store.message_seen("trainer.planner|round_command:r0/start/*")


def test_in_memory_bus_delivers_dedupes_and_dead_letters():
    bus = InMemoryBus(dedupe=MemoryDedupe())
    got: list[str] = []
    lock = threading.Lock()

    def handle(message) -> None:
        with lock:
            got.append(message.round_id)

    for _ in range(2):  # two competing workers on one queue
        bus.consume("trainer.planner", handle, consumer="trainer.planner")
    for i in range(20):
        bus.publish("trainer.planner", command(f"r{i}"))
    bus.publish("trainer.planner", command("r0"))  # a duplicate
    bus.publish_raw("trainer.planner", '{"kind": "episode_task"}')
    assert bus.wait_idle(timeout_s=30)
    bus.close()
    assert sorted(got) == sorted(f"r{i}" for i in range(20))
    [letter] = bus.dead_letters()
    assert letter.queue == "trainer.planner"
    assert "undecodable message" in letter.reason and "run_id" in letter.reason


def test_in_memory_weights_fanout_reaches_every_subscriber():
    bus = InMemoryBus(dedupe=MemoryDedupe())
    got: dict[str, list[int]] = {"a": [], "b": []}
    for name in got:
        bus.subscribe_weights(lambda m, name=name: got[name].append(m.version), consumer=name)
    bus.announce_weights(WeightsAnnouncement(model="planner", version=7, uri="u",
                                             sha256="0" * 64))
    assert bus.wait_idle(timeout_s=30)
    bus.close()
    assert got == {"a": [7], "b": [7]}


@pytest.mark.parametrize("body", ["", "null"])
def test_in_memory_bus_survives_garbage(body):
    bus = InMemoryBus()
    bus.consume("q", lambda m: None)
    bus.publish_raw("q", body)
    assert bus.wait_idle(timeout_s=30)
    bus.close()
    assert len(bus.dead_letters()) == 1
