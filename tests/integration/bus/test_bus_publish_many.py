"""``KombuBus.publish_many`` on the real RabbitMQ: a batch arrives exactly as sent (count and
order, across queues) with one confirm wait; a batch the broker cannot route, one not
confirmed in time, or one on a lost connection raises instead of vanishing, and the retry of
the whole batch goes through (consumers recognise the duplicates by idempotency key).

Every test uses its own queue names and deletes them."""

from __future__ import annotations

import socket

import pytest
from kombu import Connection

from mgrpo.bus.confirmed_batch import PublishNotConfirmed
from mgrpo.bus.errors import is_transient
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import RoundCommand, decode_message
from mgrpo.bus.topology import work_queue


@pytest.fixture
def names(unique_name):
    """The queues of a test: the work queues ``a`` and ``b`` and their dead-letter queue
    (``bus_factory``, conftest.py, makes buses on them and deletes them)."""
    return {"a": f"{unique_name}.a", "b": f"{unique_name}.b", "dlq": f"{unique_name}.dlq"}


def command(round_id: str) -> RoundCommand:
    return RoundCommand(command="train", run_id="run", round_id=round_id, model="planner")


def drain(url: str, queue: str, dlq: str) -> list[str]:
    """Every round id waiting in ``queue``, in queue order (taken off it)."""
    out = []
    with Connection(url) as connection:
        bound = work_queue(queue, dlq)(connection.channel())
        while (message := bound.get(no_ack=True)) is not None:
            out.append(decode_message(message.body).round_id)
    return out


def sent_before_each_wait(bus: KombuBus) -> list[int]:
    """How many messages the batch channel had sent at each read of the broker's frames
    (each wait for confirms)."""
    seen: list[int] = []
    connection = bus._batches.connection
    original = connection.drain_events

    def counted(*args, **kwargs):
        seen.append(bus._batches._published)
        return original(*args, **kwargs)

    connection.drain_events = counted
    return seen


def test_a_batch_arrives_as_sent_with_one_confirm_wait(bus_factory, names, rabbitmq_url):
    bus = bus_factory()
    sends = [(names["a"] if i % 3 else names["b"], command(f"r{i:03d}")) for i in range(120)]
    waits = sent_before_each_wait(bus)
    bus.publish_many(sends)
    # the whole batch is sent before the first wait for confirms (one publish each waited)
    assert waits and set(waits) == {120}
    got_a = drain(rabbitmq_url, names["a"], names["dlq"])
    got_b = drain(rabbitmq_url, names["b"], names["dlq"])
    assert got_a == [m.round_id for q, m in sends if q == names["a"]]
    assert got_b == [m.round_id for q, m in sends if q == names["b"]]
    assert len(got_a) + len(got_b) == 120
    bus.publish_many([])  # nothing to send: no error, nothing sent
    bus.publish_many(sends[:5])  # the channel serves the next batch (delivery tags go on)
    assert drain(rabbitmq_url, names["b"], names["dlq"]) == ["r000", "r003"]


def test_an_unroutable_batch_raises_and_its_retry_goes_through(bus_factory, names,
                                                              rabbitmq_url):
    bus = bus_factory()
    bus.publish_many([(names["a"], command("first"))])  # declared (and cached) here
    with Connection(rabbitmq_url) as connection:  # the queue vanishes behind our back
        work_queue(names["a"], names["dlq"])(connection.channel()).delete()
    batch = [(names["a"], command(f"r{i}")) for i in range(4)]
    with pytest.raises(PublishNotConfirmed, match="4 unroutable"):
        bus.publish_many(batch)
    bus.publish_many(batch)  # the caller's retry declares the queue again
    assert drain(rabbitmq_url, names["a"], names["dlq"]) == ["r0", "r1", "r2", "r3"]


def test_a_batch_not_confirmed_in_time_raises_and_late_acks_do_not_leak(bus_factory, names,
                                                                        rabbitmq_url):
    bus = bus_factory()
    bus._batches.timeout_s = 0.0  # every confirm is late
    with pytest.raises(PublishNotConfirmed, match="not confirmed within") as raised:
        bus.publish_many([(names["a"], command(f"late{i}")) for i in range(3)])
    assert is_transient(raised.value)  # a worker requeues its input: the batch is redone
    bus._batches.timeout_s = 30.0
    bus.publish_many([(names["a"], command(f"r{i}")) for i in range(3)])
    # the late batch did reach the queue (a retry would duplicate it: consumers dedupe)
    assert drain(rabbitmq_url, names["a"], names["dlq"]) == [
        "late0", "late1", "late2", "r0", "r1", "r2"]


def test_a_batch_on_a_lost_connection_raises_or_goes_through_once(bus_factory, names,
                                                                  rabbitmq_url):
    def cut(bus: KombuBus) -> None:  # the broker connection dies under the publisher
        bus._batches.connection.connection.transport.sock.shutdown(socket.SHUT_RDWR)

    giving_up = bus_factory(publish_retries=0)
    giving_up.publish_many([(names["a"], command("before"))])
    cut(giving_up)
    with pytest.raises(Exception) as raised:
        giving_up.publish_many([(names["a"], command(f"lost{i}")) for i in range(3)])
    assert is_transient(raised.value)
    waiting = bus_factory()  # the default: reconnect and send the whole batch again
    waiting.publish_many([(names["b"], command("before"))])
    cut(waiting)
    waiting.publish_many([(names["b"], command(f"r{i}")) for i in range(3)])
    assert drain(rabbitmq_url, names["a"], names["dlq"]) == ["before"]
    assert drain(rabbitmq_url, names["b"], names["dlq"]) == ["before", "r0", "r1", "r2"]
