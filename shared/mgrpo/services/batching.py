"""Consume a queue in batches, so one batched generation serves many messages (docs/services.md,
'One round (distributed)', step 2).

On RabbitMQ (:class:`~mgrpo.bus.kombu_bus.KombuBus`) the consumer sets prefetch to
``batch_size``, collects messages until ``batch_size`` are in, or every one collected belongs
to a send it has seen whole (``group``/``group_size`` of an episode task or a sub-agent call:
the batch is known, no waiting), or it holds a round command (a trainer's cue to check a
round now: waiting would only delay it), or none arrived for ``linger_s``; runs the batch
handler, THEN acks
every message (late acks: a worker killed mid-batch gets the whole batch redelivered). The
consumer reconnects by itself after a broker restart (``mgrpo.bus.consumer``); messages
collected on the lost channel are dropped, the broker redelivers them. Each message still goes
through the bus's rules:

- undecodable (not JSON, wrong schema, a NUL byte in an id) -> dead-letter queue, alone;
- a key already claimed -> acked and skipped; keys are claimed after the handler returns,
  the whole batch's in one statement (and checked in one query); the same key twice in one
  batch is handled once. ``claims=False`` skips both for a handler that is idempotent by
  itself (trainer ingestion: ``INSERT ... ON CONFLICT DO NOTHING``), and hands it every
  message of a key whose content differs (the handler tells a conflict from a re-send);
- the handler returns refusals ``{position: reason}`` -> those messages go to the dead-letter
  queue with the reason, the rest of the batch is handled and acked as usual;
- the batch handler fails for a transient reason (``mgrpo.bus.errors``: the database
  restarting, the sandbox service down) -> the batch is requeued after ``RETRY_DELAY_S`` and
  redelivered; nothing is lost or counted as the model's fault. The duplicate check and the
  claims are inside the same handling (a database outage there is transient too);
- the batch handler fails for any other reason -> each message of the batch is run ALONE,
  so only the message(s) that fail by themselves go to the dead-letter queue (one wrong-kind
  message never takes its batch with it);
- the batch handler crashes the consumer loop (an exception that escapes the sorting above)
  -> the batch is redelivered and each message that was in it runs ALONE from then on; one that
  crashes its handler ``HANDLER_CRASH_LIMIT`` times goes to the dead-letter queue
  (``mgrpo.bus.consumer.CrashCounter``).

On any other bus (embedded :class:`~mgrpo.bus.InMemoryBus`) batches have size 1.

What this module does NOT do: interpret messages (the handler does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from mgrpo.bus import errors
from mgrpo.bus.consumer import CrashCounter, delivery_key
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import Message, MessageDecodeError, decode_message

log = logging.getLogger(__name__)

# A handler may return refusals, {position in its batch: reason}: those messages go to the
# dead-letter queue with the reason, the others count as handled.
BatchHandler = Callable[[list[Message]], "Mapping[int, str] | None"]


class Refused(ValueError):
    """A message the handler refused (batches of one: the reason it gave)."""
RETRY_DELAY_S = errors.RETRY_DELAY_S  # between redeliveries while a service is down


def consume_batches(bus, queue: str, handler: BatchHandler, *, consumer: str,
                    batch_size: int = 16, linger_s: float = 0.3, claims: bool = True,
                    stop: threading.Event | None = None,
                    heartbeat_s: float | None = None,
                    deadline_s: float | None = None) -> threading.Thread | None:
    """Start consuming ``queue`` in batches; returns the worker thread (None: delegated to
    ``bus.consume`` with batches of one). ``claims=False``: the handler is idempotent by
    itself, so no duplicate check or claim is made (one store transaction fewer each).
    ``heartbeat_s``: the AMQP heartbeat of the consumer's connection (a handler must end well
    within it; default ``mgrpo.bus.consumer.HEARTBEAT_S``). ``deadline_s``: a batch handler
    running longer is taken as hung and its connection cut, so the broker redelivers the batch
    (``mgrpo.bus.consumer.HandlerDeadline``; None: no deadline)."""
    if not isinstance(bus, KombuBus):
        def one(message: Message) -> None:
            refused = handler([message]) or {}
            if refused:
                raise Refused(refused[0])

        bus.consume(queue, one, consumer=consumer)
        return None
    pending: list[tuple[object, Message | MessageDecodeError]] = []
    running: list = []  # the kombu messages of the batch being handled (a crash counts them)
    groups = _Groups()
    crashes = CrashCounter()

    def suspect(item) -> bool:  # was in a batch that crashed: runs alone
        return crashes.count(delivery_key(item[0].body)) > 0

    def run(batch: list) -> None:
        running[:] = [message for message, _ in batch]
        _run_batch(bus, queue, batch, handler, consumer, claims)
        running.clear()

    def on_message(message) -> None:
        try:
            decoded: Message | MessageDecodeError = decode_message(message.body)
        except MessageDecodeError as error:
            decoded = error
        groups.add(decoded)
        pending.append((message, decoded))

    def after_drain(timed_out: bool) -> None:
        if len(pending) >= batch_size or (pending and (
                timed_out or groups.whole(pending) or _holds_command(pending)
                or any(map(suspect, pending)))):
            batch, pending[:] = list(pending), []
            groups.forget(batch)
            alone = [item for item in batch if suspect(item)]
            if len(alone) < len(batch):
                run([item for item in batch if not suspect(item)])
            for item in alone:
                run([item])

    def disconnected() -> None:
        pending.clear()
        running.clear()

    return bus.serve(bus.work_queue(queue), consumer, on_message, prefetch=batch_size,
                     timeout_s=lambda: linger_s if pending else 0.5,
                     after_drain=after_drain, on_disconnect=disconnected, stop=stop,
                     heartbeat_s=heartbeat_s, deadline_s=deadline_s, crashes=crashes,
                     holding=lambda: list(running))


def _holds_command(pending: list) -> bool:
    """A round command is a cue to act now (``RoundCommand``: a trainer checks readiness)."""
    return any(getattr(decoded, "kind", "") == "round_command" for _, decoded in pending)


class _Groups:
    """The sends (``group``, ``group_size`` of a message) this consumer has seen whole: a
    batch made only of whole sends is flushed without waiting ``linger_s``."""

    LIMIT = 10_000  # groups remembered (a send never completed is forgotten eventually)

    def __init__(self) -> None:
        self.keys: dict[str, set[str]] = {}

    def add(self, decoded) -> None:
        group, size = getattr(decoded, "group", ""), getattr(decoded, "group_size", 0)
        if group and size:
            self.keys.setdefault(group, set()).add(decoded.idempotency_key)
            while len(self.keys) > self.LIMIT:
                self.keys.pop(next(iter(self.keys)))

    def _is_whole(self, decoded) -> bool:
        group, size = getattr(decoded, "group", ""), getattr(decoded, "group_size", 0)
        return bool(group and size) and len(self.keys.get(group, ())) >= size

    def whole(self, pending: list) -> bool:
        return all(self._is_whole(decoded) for _, decoded in pending)

    def forget(self, batch: list) -> None:
        for _, decoded in batch:
            if self._is_whole(decoded):
                self.keys.pop(decoded.group, None)


def _run_batch(bus, queue_name: str, raw: list, handler: BatchHandler, consumer: str,
               claims: bool = True) -> None:
    dedupe = bus._dedupe if claims else None  # the store: the claims process_payload uses
    todo: list[tuple[object, Message, str]] = []
    keys: dict[str, Message] = {}
    for message, decoded in raw:
        if isinstance(decoded, MessageDecodeError):
            bus.dead_letter(queue_name, message.body, f"undecodable message: {decoded.reason}")
            message.ack()
            continue
        key = f"{consumer}|{decoded.idempotency_key}"
        if key in keys and (claims or _same(keys[key], decoded)):
            message.ack()  # the same message twice in one batch: handled once
            continue
        keys.setdefault(key, decoded)
        todo.append((message, decoded, key))
    if todo:
        _handle(bus, queue_name, todo, handler, consumer, dedupe)


def _same(first: Message, second: Message) -> bool:
    """Two sends of one message (a re-send has a new ``message_id``, nothing else new)."""
    return first.model_copy(update={"message_id": ""}) == \
        second.model_copy(update={"message_id": ""})


def _seen(dedupe, keys: list[str]) -> set[str]:
    if hasattr(dedupe, "messages_seen"):  # one query for the batch (the store)
        return dedupe.messages_seen(keys)
    return {key for key in keys if dedupe.message_seen(key)}


def _claim(dedupe, keys: list[str], consumer: str) -> None:
    if hasattr(dedupe, "claim_messages"):
        dedupe.claim_messages(keys, consumer)
        return
    for key in keys:
        dedupe.claim_message(key, consumer)


def _handle(bus, queue_name: str, todo: list, handler: BatchHandler, consumer: str,
            dedupe) -> None:
    """Duplicate check, handler, claims, acks of decoded messages, sorted by failure kind."""
    try:
        fresh = todo
        if dedupe is not None:
            seen = _seen(dedupe, [key for _, _, key in todo])
            fresh = [item for item in todo if item[2] not in seen]
            for message, _, key in todo:
                if key in seen:
                    message.ack()
        if fresh:
            refused = handler([decoded for _, decoded, _ in fresh]) or {}
            if dedupe is not None:
                _claim(dedupe, [key for i, (_, _, key) in enumerate(fresh)
                                if i not in refused], consumer)
            for i, (message, decoded, _) in enumerate(fresh):
                if i in refused:
                    log.warning("batch handler %s refused %s: %s", consumer,
                                decoded.idempotency_key, refused[i])
                    bus.dead_letter(queue_name, message.body,
                                    f"handler {consumer} refused: {refused[i]}")
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
