"""Consume a queue in batches, so one batched generation serves many messages (SPEC 2.2:
"generation batched across episodes").

On RabbitMQ (:class:`~mgrpo.bus.kombu_bus.KombuBus`) the consumer sets prefetch to
``batch_size``, collects what arrives within ``linger_s``, runs the batch handler, THEN acks
every message (late acks: a worker killed mid-batch gets the whole batch redelivered). The
consumer reconnects by itself after a broker restart (``mgrpo.bus.consumer``); messages
collected on the lost channel are dropped, the broker redelivers them. Each message still goes
through the bus's rules:

- undecodable (not JSON, wrong schema, a NUL byte in an id) -> dead-letter queue, alone;
- a key already claimed -> acked and skipped; keys are claimed after the handler returns;
- the batch handler fails for a transient reason (``mgrpo.bus.errors``: the database
  restarting, the sandbox service down) -> the batch is requeued after ``RETRY_DELAY_S`` and
  redelivered; nothing is lost or counted as the model's fault. The duplicate check and the
  claims are inside the same handling (a database outage there is transient too);
- the batch handler fails for any other reason -> each message of the batch is run ALONE,
  so only the message(s) that fail by themselves go to the dead-letter queue (one wrong-kind
  message never takes its batch with it).

On any other bus (embedded :class:`~mgrpo.bus.InMemoryBus`) batches have size 1.

What this module does NOT do: interpret messages (the handler does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mgrpo.bus import errors
from mgrpo.bus.messages import Message, MessageDecodeError, decode_message

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[Message]], None]
RETRY_DELAY_S = errors.RETRY_DELAY_S  # between redeliveries while a service is down


def consume_batches(bus, queue: str, handler: BatchHandler, *, consumer: str,
                    batch_size: int = 16, linger_s: float = 0.3,
                    stop: threading.Event | None = None) -> threading.Thread | None:
    """Start consuming ``queue`` in batches; returns the worker thread (None: delegated to
    ``bus.consume`` with batches of one)."""
    from mgrpo.bus.kombu_bus import KombuBus

    if not isinstance(bus, KombuBus):
        bus.consume(queue, lambda message: handler([message]), consumer=consumer)
        return None
    pending: list = []

    def after_drain(timed_out: bool) -> None:
        if len(pending) >= batch_size or (timed_out and pending):
            batch, pending[:] = list(pending), []
            _run_batch(bus, queue, batch, handler, consumer)

    return bus.serve(bus.work_queue(queue), consumer, pending.append, prefetch=batch_size,
                     timeout_s=lambda: linger_s if pending else 0.5,
                     after_drain=after_drain, on_disconnect=pending.clear, stop=stop)


def _run_batch(bus, queue_name: str, raw: list, handler: BatchHandler, consumer: str) -> None:
    dedupe = bus._dedupe  # the store: the same claims process_payload uses
    todo: list[tuple[object, Message, str]] = []
    for message in raw:
        try:
            decoded = decode_message(message.body)
        except MessageDecodeError as error:
            bus.dead_letter(queue_name, message.body, f"undecodable message: {error.reason}")
            message.ack()
            continue
        todo.append((message, decoded, f"{consumer}|{decoded.idempotency_key}"))
    if todo:
        _handle(bus, queue_name, todo, handler, consumer, dedupe)


def _handle(bus, queue_name: str, todo: list, handler: BatchHandler, consumer: str,
            dedupe) -> None:
    """Duplicate check, handler, claims, acks of decoded messages, sorted by failure kind."""
    try:
        fresh = []
        for message, decoded, key in todo:
            if dedupe is not None and dedupe.message_seen(key):
                message.ack()
            else:
                fresh.append((message, decoded, key))
        if fresh:
            handler([decoded for _, decoded, _ in fresh])
            for message, _, key in fresh:
                if dedupe is not None:
                    dedupe.claim_message(key, consumer)
                message.ack()
    except Exception as error:  # sorted: retry, split the batch, or dead-letter one message
        if errors.is_transient(error):  # not the messages' fault: try them again later
            log.warning("batch handler %s: %s: %s; requeueing %d messages in %.0f s",
                        consumer, type(error).__name__, error, len(todo), RETRY_DELAY_S)
            time.sleep(RETRY_DELAY_S)
            for message, _, _ in todo:
                if not message.acknowledged:
                    message.requeue()
            return
        if len(todo) > 1:  # find the bad one(s): each message alone
            log.warning("batch handler %s failed on %d messages (%s: %s); running each alone",
                        consumer, len(todo), type(error).__name__, error)
            for item in todo:
                if not item[0].acknowledged:
                    _handle(bus, queue_name, [item], handler, consumer, dedupe)
            return
        message, decoded, _ = todo[0]
        log.exception("batch handler %s failed on %s", consumer, decoded.idempotency_key)
        bus.dead_letter(queue_name, message.body,
                        f"handler {consumer} failed: {type(error).__name__}: {error}")
        message.ack()
