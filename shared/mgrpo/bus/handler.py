"""One delivery, the same on every transport: decode -> skip a duplicate -> call the handler ->
record it done. A "task is much like a web view": the handler holds the logic, this holds
the plumbing.

Order matters. The idempotency key is recorded AFTER the handler succeeds: a worker that
dies mid-handler leaves the key unclaimed, so the redelivered message runs again (handlers
are idempotent upserts); a worker that dies after the handler but before its ack leaves the
key claimed, so the redelivery is recognised and only acked. Claims are per consumer
(``"<consumer>|<key>"``), so a fanout message is processed once by EACH subscriber.

Failures are sorted (``mgrpo.bus.errors``): an undecodable payload or a handler error that is
the message's fault gives ``dead_letter``; an infrastructure failure (the database restarting,
the broker connection lost, the sandbox down) gives ``retry`` and claims nothing. The
duplicate check itself talks to the database, so it is inside that sorting too: a database
outage during it is a ``retry``, never a dead consumer.

What this module does NOT do: ack, reject or publish. The transport acts on the returned
:class:`Outcome` (``dead_letter``: publish to the dead-letter queue with ``reason``, then ack;
``retry``: requeue after a pause).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from mgrpo.bus.messages import Message, MessageDecodeError, decode_message

log = logging.getLogger(__name__)

Handler = Callable[[Message], None]


class Dedupe(Protocol):
    """What :class:`mgrpo.store.Store` offers for idempotency (or :class:`MemoryDedupe`)."""

    def message_seen(self, key: str) -> bool: ...

    def claim_message(self, key: str, consumer: str = "") -> bool: ...


class MemoryDedupe:
    """Process-local processed-key set for embedded runs without a store."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def message_seen(self, key: str) -> bool:
        with self._lock:
            return key in self._keys

    def claim_message(self, key: str, consumer: str = "") -> bool:
        with self._lock:
            new = key not in self._keys
            self._keys.add(key)
            return new


@dataclass(frozen=True)
class Outcome:
    status: Literal["done", "duplicate", "dead_letter", "retry"]
    reason: str | None = None
    message: Message | None = None


def process_payload(payload: bytes | str | dict, handler: Handler, *,
                    dedupe: Dedupe | None = None, consumer: str = "") -> Outcome:
    """Decode ``payload``, run ``handler`` once per idempotency key, say what happened.

    Undecodable payloads and handler exceptions give ``dead_letter`` with the reason (the
    exception is logged with its traceback); infrastructure failures anywhere (duplicate
    check, handler, claim) give ``retry``; nothing here raises.
    """
    try:
        message = decode_message(payload)
    except MessageDecodeError as error:
        return Outcome("dead_letter", f"undecodable message: {error.reason}")
    key = f"{consumer}|{message.idempotency_key}"
    try:
        if dedupe is not None and dedupe.message_seen(key):
            log.info("duplicate %s (%s) skipped by %s", message.kind, message.idempotency_key,
                     consumer)
            return Outcome("duplicate", message=message)
        handler(message)
        if dedupe is not None:
            dedupe.claim_message(key, consumer)
    except Exception as error:  # sorted below; the worker lives on either way
        return failure_outcome(error, consumer, message)
    return Outcome("done", message=message)


def failure_outcome(error: Exception, consumer: str, message: Message | None) -> Outcome:
    """``retry`` for an infrastructure failure, else ``dead_letter`` with the reason."""
    # here, not at the top: an import circle through mgrpo.bus.errors
    from mgrpo.bus.errors import is_transient

    key = message.idempotency_key if message is not None else "?"
    if is_transient(error):
        log.warning("%s: transient failure on %s, will retry: %s: %s", consumer or "?", key,
                    type(error).__name__, error)
        return Outcome("retry", f"{type(error).__name__}: {error}", message)
    log.exception("handler %s failed on %s", consumer or "?", key)
    return Outcome("dead_letter", f"handler {consumer or '?'} failed: "
                   f"{type(error).__name__}: {error}", message)
