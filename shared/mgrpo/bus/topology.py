"""kombu declarations of the queue topology (names in ``mgrpo.bus.names``), shared by the
Celery app and :class:`mgrpo.bus.kombu_bus.KombuBus` so both declare identical queues
(RabbitMQ refuses a re-declaration with different arguments).

Work queues are durable and carry ``x-dead-letter-exchange``: a message the broker or Celery
rejects without requeue (e.g. a pickle, refused by ``accept_content=["json"]``) lands in the
dead-letter queue with RabbitMQ's ``x-death`` header. Messages our own code refuses are
published there explicitly with the reason in the ``x-mgrpo-reason`` header.
"""

from __future__ import annotations

from kombu import Exchange, Queue

from mgrpo.bus.names import DEAD_LETTER_EXCHANGE, DEAD_LETTER_QUEUE, WEIGHTS_EXCHANGE

WORK_EXCHANGE = Exchange("mgrpo", type="direct", durable=True)
DLX = Exchange(DEAD_LETTER_EXCHANGE, type="direct", durable=True)
WEIGHTS = Exchange(WEIGHTS_EXCHANGE, type="fanout", durable=True)


def work_queue(name: str, dead_letter_queue: str = DEAD_LETTER_QUEUE) -> Queue:
    """A durable work queue bound to ``mgrpo`` by its own name, dead-lettering to the DLQ."""
    return Queue(name, exchange=WORK_EXCHANGE, routing_key=name, durable=True,
                 queue_arguments={"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
                                  "x-dead-letter-routing-key": dead_letter_queue})


def dead_letter_queue(name: str = DEAD_LETTER_QUEUE) -> Queue:
    return Queue(name, exchange=DLX, routing_key=name, durable=True)
