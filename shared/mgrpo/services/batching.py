"""Consume a queue in batches, so one batched generation serves many messages (SPEC 2.2:
"generation batched across episodes").

On RabbitMQ (:class:`~mgrpo.bus.kombu_bus.KombuBus`) the consumer sets prefetch to
``batch_size``, collects what arrives within ``linger_s``, runs the batch handler, THEN acks
every message (late acks: a worker killed mid-batch gets the whole batch redelivered). Each
message still goes through the bus's rules: undecodable -> dead-letter queue with the reason;
a key already claimed -> acked and skipped; keys are claimed after the handler returns.
If the batch handler raises, every message of the batch is dead-lettered with the reason,
EXCEPT for an infrastructure failure (:func:`redeliver_on`: the sandbox service is down):
then the batch is requeued after ``RETRY_DELAY_S`` and redelivered; nothing is lost or
counted as the model's fault.

On any other bus (embedded :class:`~mgrpo.bus.InMemoryBus`) batches have size 1.

What this module does NOT do: interpret messages (the handler does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mgrpo.bus.messages import Message, MessageDecodeError, decode_message

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[Message]], None]
RETRY_DELAY_S = 2.0  # between redeliveries while a service is down: no hot loop


def redeliver_on() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "our infrastructure failed", not "this message is bad"."""
    from mgrpo.sandbox.client import SandboxUnavailable

    return (SandboxUnavailable,)


def consume_batches(bus, queue: str, handler: BatchHandler, *, consumer: str,
                    batch_size: int = 16, linger_s: float = 0.3,
                    stop: threading.Event | None = None) -> threading.Thread | None:
    """Start consuming ``queue`` in batches; returns the worker thread (None: delegated to
    ``bus.consume`` with batches of one)."""
    from mgrpo.bus.kombu_bus import KombuBus

    if not isinstance(bus, KombuBus):
        bus.consume(queue, lambda message: handler([message]), consumer=consumer)
        return None
    stop = stop or threading.Event()
    ready = threading.Event()
    thread = threading.Thread(target=_kombu_loop, name=f"batch-{queue}", daemon=True,
                              args=(bus, queue, handler, consumer, batch_size, linger_s,
                                    stop, ready))
    thread.start()
    if not ready.wait(timeout=30):
        raise TimeoutError(f"batch consumer on {queue!r} did not start within 30 s; is "
                           f"RabbitMQ reachable at {bus.broker_url}?")
    return thread


def _kombu_loop(bus, queue_name: str, handler: BatchHandler, consumer: str, batch_size: int,
                linger_s: float, stop: threading.Event, ready: threading.Event) -> None:
    from kombu import Connection, Consumer

    queue = bus.work_queue(queue_name)
    bus.declare_queue(queue)
    pending: list = []
    with Connection(bus.broker_url) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_size=0, prefetch_count=batch_size, a_global=False)
        with Consumer(channel, queues=[queue], on_message=pending.append, no_ack=False,
                      accept=["json"], prefetch_count=batch_size):
            ready.set()
            while not stop.is_set() and not getattr(bus, "_stop", threading.Event()).is_set():
                try:
                    connection.drain_events(timeout=linger_s if pending else 0.5)
                    if len(pending) < batch_size:
                        continue
                except TimeoutError:
                    if not pending:
                        continue
                batch, pending[:] = list(pending), []
                _run_batch(bus, queue_name, batch, handler, consumer)


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
        key = f"{consumer}|{decoded.idempotency_key}"
        if dedupe is not None and dedupe.message_seen(key):
            message.ack()
            continue
        todo.append((message, decoded, key))
    if todo:
        try:
            handler([decoded for _, decoded, _ in todo])
        except redeliver_on() as error:  # not the messages' fault: try them again later
            log.warning("batch handler %s: %s; requeueing %d messages in %.0f s", consumer,
                        error, len(todo), RETRY_DELAY_S)
            time.sleep(RETRY_DELAY_S)
            for message, _, _ in todo:
                message.requeue()
            return
        except Exception as error:  # the reason goes to the DLQ; the worker lives on
            log.exception("batch handler %s failed on %d messages", consumer, len(todo))
            reason = f"handler {consumer} failed: {type(error).__name__}: {error}"
            for message, _, _ in todo:
                bus.dead_letter(queue_name, message.body, reason)
                message.ack()
            return
        for message, _, key in todo:
            if dedupe is not None:
                dedupe.claim_message(key, consumer)
            message.ack()
