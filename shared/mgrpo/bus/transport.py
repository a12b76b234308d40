"""The small bus interface services use, and its embedded implementation.

``Bus``: ``publish(queue, message)``, ``publish_many([(queue, message), ...])`` (in order,
all-or-raise), ``consume(queue, handler, consumer=...)``,
``announce_weights(announcement)``, ``subscribe_weights(handler, consumer=...)``,
``dead_letters()``, ``close()``. :class:`InMemoryBus` runs it in one process with in-thread
workers (embedded mode; docs/messages.md, 'Transports');
:class:`mgrpo.bus.kombu_bus.KombuBus` runs the same
interface on RabbitMQ. Both send JSON text, so a message that would not survive the wire
fails here too.

What this module does NOT do: persistence. Messages of an InMemoryBus die with the process.
"""

from __future__ import annotations

import json
import queue as queue_module
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mgrpo.bus.errors import RETRY_DELAY_S
from mgrpo.bus.handler import Dedupe, Handler, Outcome, process_payload
from mgrpo.bus.messages import Message, WeightsAnnouncement, encode_message


@dataclass(frozen=True)
class DeadLetter:
    queue: str  # where the message was consumed from
    body: str
    reason: str
    # what a replay needs to be consumed as it was sent: the original headers (a Celery
    # task's name and id travel there), less the dead-lettering ones, and the content type
    headers: dict = field(default_factory=dict, compare=False)
    content_type: str = field(default="application/json", compare=False)
    raw: bytes | None = field(default=None, compare=False, repr=False)  # the body, as sent


class Bus(Protocol):
    def publish(self, queue: str, message: Message) -> None: ...

    def publish_many(self, sends: Sequence[tuple[str, Message]]) -> None: ...

    def consume(self, queue: str, handler: Handler, *, consumer: str = "",
                dedupe: bool = True) -> None: ...

    def announce_weights(self, announcement: WeightsAnnouncement) -> None: ...

    def subscribe_weights(self, handler: Handler, *, consumer: str = "") -> None: ...

    def dead_letter(self, queue: str, body: str | bytes, reason: str) -> None: ...

    def dead_letters(self) -> list[DeadLetter]: ...

    def close(self) -> None: ...


def to_wire(message: Message) -> str:
    return json.dumps(encode_message(message), separators=(",", ":"))


class InMemoryBus:
    """In-process queues, one daemon worker thread per ``consume`` call.

    ``dedupe`` (a Store or MemoryDedupe) recognises duplicates as the distributed bus does.
    :meth:`wait_idle` blocks until every queue is drained and every handler has returned.
    """

    def __init__(self, dedupe: Dedupe | None = None, poll_s: float = 0.05) -> None:
        self._queues: dict[str, queue_module.Queue[str]] = {}
        self._weights_subscribers: list[str] = []
        self._dead: list[DeadLetter] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._dedupe = dedupe
        self._poll_s = poll_s

    def _queue(self, name: str) -> queue_module.Queue[str]:
        with self._lock:
            return self._queues.setdefault(name, queue_module.Queue())

    def publish(self, queue: str, message: Message) -> None:
        self.publish_raw(queue, to_wire(message))

    def publish_many(self, sends: Sequence[tuple[str, Message]]) -> None:
        for queue, message in sends:
            self.publish(queue, message)

    def publish_raw(self, queue: str, body: str) -> None:
        """Put a wire body as is (tests: malformed payloads)."""
        self._queue(queue).put(body)

    def dead_letter(self, queue: str, body: str | bytes, reason: str) -> None:
        """Record a refused message with why and from where (as :class:`KombuBus` does)."""
        with self._lock:
            self._dead.append(DeadLetter(queue, body if isinstance(body, str)
                                         else body.decode("utf-8", "replace"), reason))

    def consume(self, queue: str, handler: Handler, *, consumer: str = "",
                dedupe: bool = True) -> None:
        """``dedupe=False``: no duplicate check or claim (a handler idempotent by itself)."""
        source = self._queue(queue)
        thread = threading.Thread(target=self._work,
                                  args=(queue, source, handler, consumer, dedupe),
                                  name=f"bus-{queue}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def consumed_queues(self) -> set[str]:
        """The queues a live worker thread of this bus consumes (an embedded API's check
        that its sub-agents are served in this process)."""
        return {t.name.removeprefix("bus-") for t in self._threads if t.is_alive()}

    def _work(self, name: str, source: queue_module.Queue[str], handler: Handler,
              consumer: str, dedupe: bool = True) -> None:
        while not self._stop.is_set():
            try:
                body = source.get(timeout=self._poll_s)
            except queue_module.Empty:
                continue
            try:
                outcome: Outcome = process_payload(
                    body, handler, dedupe=self._dedupe if dedupe else None,
                    consumer=consumer or name)
                if outcome.status == "dead_letter":
                    with self._lock:
                        self._dead.append(DeadLetter(name, body, outcome.reason or ""))
                elif outcome.status == "retry":  # infrastructure down: again, after a pause
                    self._stop.wait(RETRY_DELAY_S)
                    source.put(body)
            finally:
                source.task_done()

    def announce_weights(self, announcement: WeightsAnnouncement) -> None:
        with self._lock:
            subscribers = list(self._weights_subscribers)
        for name in subscribers:
            self.publish(name, announcement)

    def subscribe_weights(self, handler: Handler, *, consumer: str = "") -> None:
        with self._lock:
            name = f"weights.{len(self._weights_subscribers)}"
            self._weights_subscribers.append(name)
        self.consume(name, handler, consumer=consumer or name)

    def dead_letters(self) -> list[DeadLetter]:
        with self._lock:
            return list(self._dead)

    def consumer_problems(self, grace_s: float = 0.0) -> list[str]:
        """Why some consumer is not consuming (its thread died); empty when all are."""
        return [f"consumer thread {t.name} is dead" for t in self._threads
                if not t.is_alive() and not self._stop.is_set()]

    def pending(self) -> int:
        """Messages put but not yet fully handled, over every queue."""
        with self._lock:
            queues = list(self._queues.values())
        return sum(q.unfinished_tasks for q in queues)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until nothing is pending; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.pending():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
