"""The bus on the real RabbitMQ: dead letters keep their reason, a redelivery after a worker
dies is processed once, weights fan out, the broker dead-letters what it rejects.

Every test uses its own queue names (and its own dead-letter queue) and deletes them."""

from __future__ import annotations

import threading
import time

import pytest
from kombu import Connection
from waiting import wait_for

from mgrpo.bus import MemoryDedupe, process_payload
from mgrpo.bus.messages import RoundCommand, WeightsAnnouncement
from mgrpo.bus.names import REASON_HEADER
from mgrpo.bus.topology import work_queue
from mgrpo.bus.transport import to_wire


@pytest.fixture
def names(unique_name):
    """The queues of a test: a work queue and its dead-letter queue (``bus_factory``,
    conftest.py, makes buses on them and deletes them)."""
    return {"queue": f"{unique_name}.work", "dlq": f"{unique_name}.dlq"}


def queue_depth(url: str, queue) -> int:
    with Connection(url) as connection:
        _, count, _ = queue(connection.channel()).queue_declare(passive=True)
        return count


def command(round_id: str) -> RoundCommand:
    return RoundCommand(command="train", run_id="run", round_id=round_id, model="planner")


def test_messages_are_delivered_and_acked(bus_factory, names, rabbitmq_url):
    bus = bus_factory(MemoryDedupe())
    got: list[str] = []
    bus.consume(names["queue"], lambda m: got.append(m.round_id), consumer="trainer.planner")
    for i in range(5):
        bus.publish(names["queue"], command(f"r{i}"))
    bus.publish(names["queue"], command("r0"))  # duplicate: same idempotency key
    assert wait_for(lambda: len(got) == 5)
    assert wait_for(lambda: queue_depth(rabbitmq_url, work_queue(names["queue"], names["dlq"]))
                    == 0)
    assert sorted(got) == [f"r{i}" for i in range(5)]


def test_malformed_message_lands_in_dlq_with_its_reason(bus_factory, names):
    bus = bus_factory(MemoryDedupe())
    bus.consume(names["queue"], lambda m: None)
    bus.publish_raw(names["queue"], b'{"kind": "trajectory", "schema_version": 1}')
    bus.publish_raw(names["queue"], b"\x80\x04pickle?")
    letters: list = []
    assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 2)
    reasons = sorted(letter.reason for letter in letters)
    assert all(letter.queue == names["queue"] for letter in letters)
    assert "invalid 'trajectory' message: trajectory.trajectory: Field required" in reasons[0]
    assert "not UTF-8" in reasons[1]


def test_broker_rejection_is_dead_lettered_by_the_queue_arguments(bus_factory, names,
                                                                  rabbitmq_url):
    bus = bus_factory()
    bus.publish_raw(names["queue"], to_wire(command("r0")))
    with Connection(rabbitmq_url) as connection:
        message = work_queue(names["queue"], names["dlq"])(connection.channel()).get()
        message.reject(requeue=False)  # what Celery does with a refused (e.g. pickle) body
    letters: list = []
    assert wait_for(lambda: letters.extend(bus.dead_letters()) or letters)
    assert letters[0].reason == f"broker: rejected from queue {names['queue']}"
    assert letters[0].queue == names["queue"]


def test_redelivery_after_a_worker_dies_is_processed_once(bus_factory, names, rabbitmq_url):
    dedupe = MemoryDedupe()  # stands for the store: shared by both workers
    bus = bus_factory(dedupe)
    calls: list[str] = []
    lock = threading.Lock()

    def handle(message) -> None:
        with lock:
            calls.append(message.round_id)

    bus.publish(names["queue"], command("r-crash"))
    # worker 1: takes the message, handles it, dies before acking (connection closed)
    connection = Connection(rabbitmq_url)
    message = work_queue(names["queue"], names["dlq"])(connection.channel()).get(no_ack=False)
    assert message is not None
    outcome = process_payload(message.body, handle, dedupe=dedupe, consumer="trainer.planner")
    assert outcome.status == "done"
    connection.close()  # no ack: the broker requeues it
    # worker 2 gets the redelivery and recognises it
    redelivered: list[bool] = []
    bus.consume(names["queue"], lambda m: (redelivered.append(True), handle(m)),
                consumer="trainer.planner")
    assert wait_for(lambda: queue_depth(rabbitmq_url, work_queue(names["queue"], names["dlq"]))
                    == 0)
    time.sleep(0.3)  # let a (wrong) second handling show up if it were going to
    assert calls == ["r-crash"]
    assert redelivered == []
    assert bus.dead_letters() == []


def test_weights_announcement_fans_out(bus_factory):
    bus = bus_factory()
    got: dict[str, list[int]] = {"planner-worker": [], "searcher-worker": []}
    for name in got:
        bus.subscribe_weights(lambda m, name=name: got[name].append(m.version), consumer=name)
    bus.announce_weights(WeightsAnnouncement(model="planner", version=3, uri="file:///c/3",
                                             sha256="a" * 64))
    assert wait_for(lambda: all(got.values()))
    assert got == {"planner-worker": [3], "searcher-worker": [3]}


def test_reason_header_name_is_stable():
    assert REASON_HEADER == "x-mgrpo-reason"
