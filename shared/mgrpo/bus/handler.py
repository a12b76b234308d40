"""One delivery, the same on every transport: decode -> skip a duplicate -> call the handler ->
record it done. A "task is much like a web view": the handler holds the logic, this holds
the plumbing.

Order matters. The idempotency key is recorded AFTER the handler succeeds: a worker that
dies mid-handler leaves the key unclaimed, so the redelivered message runs again (handlers
are idempotent upserts); a worker that dies after the handler but before its ack leaves the
key claimed, so the redelivery is recognised and only acked. Claims are per consumer
(``"<consumer>|<key>"``), so a fanout message is processed once by EACH subscriber.

What this module does NOT do: ack, reject or publish. The transport acts on the returned
:class:`Outcome` (``dead_letter``: publish to the dead-letter queue with ``reason``, then ack).
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
    status: Literal["done", "duplicate", "dead_letter"]
    reason: str | None = None
    message: Message | None = None


def process_payload(payload: bytes | str | dict, handler: Handler, *,
                    dedupe: Dedupe | None = None, consumer: str = "") -> Outcome:
    """Decode ``payload``, run ``handler`` once per idempotency key, say what happened.

    Undecodable payloads and handler exceptions give ``dead_letter`` with the reason (the
    exception is logged with its traceback); nothing here raises.
    """
    try:
        message = decode_message(payload)
    except MessageDecodeError as error:
        return Outcome("dead_letter", f"undecodable message: {error.reason}")
    key = f"{consumer}|{message.idempotency_key}"
    if dedupe is not None and dedupe.message_seen(key):
        log.info("duplicate %s (%s) skipped by %s", message.kind, message.idempotency_key,
                 consumer)
        return Outcome("duplicate", message=message)
    try:
        handler(message)
    except Exception as error:  # the reason goes to the dead-letter queue, the worker lives on
        log.exception("handler %s failed on %s", consumer, message.idempotency_key)
        return Outcome("dead_letter", f"handler {consumer or '?'} failed: "
                       f"{type(error).__name__}: {error}", message)
    if dedupe is not None:
        dedupe.claim_message(key, consumer)
    return Outcome("done", message=message)
