"""Fixtures of the bus's integration tests on the real RabbitMQ.

A module names its queues with a ``names`` fixture: ``"dlq"``, its dead-letter queue, and
any other keys, its work queues. ``bus_factory`` makes ``KombuBus`` instances on them
(``bus_factory(dedupe=None, **kwargs)``) and afterwards closes them and deletes those
queues."""

from __future__ import annotations

import pytest
from kombu import Connection

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.topology import dead_letter_queue, work_queue


@pytest.fixture
def bus_factory(rabbitmq_url, names):
    made: list[KombuBus] = []

    def make(dedupe=None, **kwargs) -> KombuBus:
        bus = KombuBus(rabbitmq_url, dedupe, dead_letter_queue_name=names["dlq"], **kwargs)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.close()
    with Connection(rabbitmq_url) as connection:
        channel = connection.channel()
        for key, queue in names.items():
            if key != "dlq":
                work_queue(queue, names["dlq"])(channel).delete()
        dead_letter_queue(names["dlq"])(channel).delete()
