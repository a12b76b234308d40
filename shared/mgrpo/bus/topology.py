"""kombu declarations of the queue topology (names in ``mgrpo.bus.names``), shared by the
Celery app and :class:`mgrpo.bus.kombu_bus.KombuBus` so both declare identical queues
(RabbitMQ refuses a re-declaration with different arguments).

Work queues are durable and carry ``x-dead-letter-exchange``: a message the broker or Celery
rejects without requeue (e.g. a pickle, refused by ``accept_content=["json"]``) lands in the
dead-letter queue with RabbitMQ's ``x-death`` header. Messages our own code refuses are
published there explicitly with the reason in the ``x-mgrpo-reason`` header.

Per-worker reply queues (``[<prefix>]planner.replies.<worker id>``) belong to ONE process and
are useless once it is gone, so they are ``auto_delete`` (RabbitMQ deletes them when their
last consumer goes) with ``x-expires`` as a backstop (a reply published after the worker died
can re-create the queue; unused, it is deleted after :data:`REPLY_QUEUE_EXPIRES_MS`). Acks stay
late on them as on every queue. Both are decided HERE, from the name, because every process
that touches a queue declares it (publishers too) and RabbitMQ refuses a re-declaration with
different arguments.
"""

from __future__ import annotations

from kombu import Exchange, Queue

from mgrpo.bus.names import (
    DEAD_LETTER_EXCHANGE,
    DEAD_LETTER_QUEUE,
    PLANNER_REPLY_QUEUE,
    WEIGHTS_EXCHANGE,
)

WORK_EXCHANGE = Exchange("mgrpo", type="direct", durable=True)
DLX = Exchange(DEAD_LETTER_EXCHANGE, type="direct", durable=True)
WEIGHTS = Exchange(WEIGHTS_EXCHANGE, type="fanout", durable=True)
# Long enough for any reply in flight (the dispatcher waits 300 s), short enough not to pile up.
REPLY_QUEUE_EXPIRES_MS = 10 * 60 * 1000


def is_reply_queue(name: str) -> bool:
    """A per-worker reply queue: ``[<prefix>]planner.replies.<worker id>`` (not the shared
    ``planner.replies`` of the Celery app)."""
    return f".{PLANNER_REPLY_QUEUE}." in f".{name}"


def work_queue(name: str, dead_letter_queue: str = DEAD_LETTER_QUEUE) -> Queue:
    """A durable work queue bound to ``mgrpo`` by its own name, dead-lettering to the DLQ;
    a per-worker reply queue is also auto-delete and expiring (see the module docstring)."""
    arguments = {"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
                 "x-dead-letter-routing-key": dead_letter_queue}
    reply = is_reply_queue(name)
    if reply:
        arguments["x-expires"] = REPLY_QUEUE_EXPIRES_MS
    return Queue(name, exchange=WORK_EXCHANGE, routing_key=name, durable=True,
                 auto_delete=reply, queue_arguments=arguments)


def dead_letter_queue(name: str = DEAD_LETTER_QUEUE) -> Queue:
    return Queue(name, exchange=DLX, routing_key=name, durable=True)
