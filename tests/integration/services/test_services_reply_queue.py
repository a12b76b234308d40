"""Per-worker reply queues on the real RabbitMQ: they go away with their consumer (no leak of
``planner.replies.<worker id>`` queues), while work queues stay (late acks, durable)."""

from __future__ import annotations

import time

from amqp.exceptions import NotFound
from kombu import Connection

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.topology import REPLY_QUEUE_EXPIRES_MS, work_queue
from mgrpo.services.context import Queues
from mgrpo.services.dispatch import BusDispatch


def queue_exists(broker_url: str, name: str) -> bool:
    with Connection(broker_url) as connection:
        try:
            connection.channel().queue_declare(queue=name, passive=True)
        except NotFound:
            return False
        return True


def gone_within(broker_url: str, name: str, seconds: float = 10.0) -> bool:
    """Polls: the broker deletes the queue asynchronously after the consumer's cancel."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not queue_exists(broker_url, name):
            return True
        time.sleep(0.1)
    return False


def test_reply_queue_is_deleted_when_its_consumer_closes(rabbitmq_url, unique_name):
    queues = Queues(f"{unique_name}.")
    reply, work = queues.replies("host-1234-abc"), queues.trainer("planner")
    declared = work_queue(reply)
    assert declared.auto_delete and declared.queue_arguments["x-expires"] == \
        REPLY_QUEUE_EXPIRES_MS
    assert not work_queue(work).auto_delete

    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=queues.dead_letter)
    BusDispatch(bus, reply, lambda role: None)  # consumes its reply queue, as a worker does
    bus.consume(work, lambda message: None)
    assert queue_exists(rabbitmq_url, reply) and queue_exists(rabbitmq_url, work)
    bus.close()
    try:
        assert gone_within(rabbitmq_url, reply)
        assert queue_exists(rabbitmq_url, work)  # work queues outlive their consumers
    finally:
        with Connection(rabbitmq_url) as connection:
            channel = connection.channel()
            for name in (work, reply, queues.dead_letter):
                try:
                    channel.queue_delete(name)
                except Exception:  # already gone: nothing to clean
                    channel = connection.channel()
