"""The :class:`~mgrpo.bus.transport.Bus` interface on RabbitMQ (kombu), for distributed mode.

Delivery rules (docs/messages.md, 'Transports'): durable queues, persistent messages, JSON
bodies, prefetch 1, ack
AFTER the handler (late ack), so a worker that dies mid-message gets it redelivered; a
redelivered message whose key was already claimed is acked without re-running the handler
(:func:`mgrpo.bus.handler.process_payload`). A message we refuse (undecodable, or its handler
raised) is published to the dead-letter queue with the reason in the ``x-mgrpo-reason``
header and the source queue in ``x-mgrpo-source-queue``, then acked.

A handler that failed for a transient reason (the database restarting, the sandbox down:
``mgrpo.bus.errors``) gets its message requeued after ``RETRY_DELAY_S``, never dead-lettered.

Each consumer runs on its own thread with its own connection (kombu connections are not
thread-safe) and reconnects by itself when the broker restarts (``mgrpo.bus.consumer``);
:meth:`KombuBus.consumer_problems` says which consumers are not consuming (health checks).
Publishing shares one connection behind a lock, with publisher confirms and kombu's retry (a
publish during a broker restart waits for it, then goes through; none is silently dropped).
A confirm that does not come within ``confirm_timeout_s`` (a half-open connection, a stalled
broker) counts as a lost connection: the publish reconnects and goes again, never waits
forever.
:meth:`KombuBus.publish_many` sends several messages on a second connection and waits for
the broker's confirms once for all of them (``mgrpo.bus.confirmed_batch``), under the same
retry; a batch the broker does not confirm raises, to be published again whole.

What this module does NOT do: run Celery tasks (``mgrpo.bus.app``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from kombu import Connection, Producer, Queue

from mgrpo.bus.confirmed_batch import ConfirmedBatches, Outgoing
from mgrpo.bus.consumer import ConsumerState, CrashCounter, serve_queue
from mgrpo.bus.errors import RETRY_DELAY_S
from mgrpo.bus.handler import Dedupe, Handler, process_payload
from mgrpo.bus.messages import Message, WeightsAnnouncement
from mgrpo.bus.names import DEAD_LETTER_QUEUE, REASON_HEADER, SOURCE_QUEUE_HEADER
from mgrpo.bus.topology import DLX, WEIGHTS, WORK_EXCHANGE, dead_letter_queue, work_queue
from mgrpo.bus.transport import DeadLetter, to_wire
from mgrpo.errors import TransientError

log = logging.getLogger(__name__)
CONFIRM_TIMEOUT_S = 30.0  # a publish without the broker's confirm by then: connection lost


class KombuBus:
    def __init__(self, broker_url: str, dedupe: Dedupe | None = None, *,
                 dead_letter_queue_name: str = DEAD_LETTER_QUEUE,
                 publish_retries: int | None = None,
                 confirm_timeout_s: float = CONFIRM_TIMEOUT_S) -> None:
        """``publish_retries``: reconnections a publish tries before it raises (None: wait
        out a broker restart however long it takes). ``confirm_timeout_s``: how long a
        publish waits for the broker's confirm before it counts the connection as lost
        (then reconnects and publishes again, under ``publish_retries``)."""
        self.broker_url = broker_url
        self.dead_letter_queue_name = dead_letter_queue_name
        self._dedupe = dedupe
        self._publish_lock = threading.Lock()
        # confirm_publish: publish() returns once the broker has the message, so a publish
        # racing a broker restart raises (and kombu retries it) instead of vanishing.
        self._connection = Connection(broker_url, transport_options={"confirm_publish": True})
        self._producer = Producer(self._connection.channel())
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.consumers: list[ConsumerState] = []
        # (since, why) while publishes fail to reach the broker: a worker blocked in a
        # publish is not consuming either, even if its consumer has not noticed yet
        self._publish_down: tuple[float, str] | None = None
        self._retry = {**RETRY_POLICY, "errback": self._publish_failed,
                       "max_retries": publish_retries}
        self.confirm_timeout_s = confirm_timeout_s
        self._batches = ConfirmedBatches(broker_url, timeout_s=confirm_timeout_s)
        self._batch_lock = threading.Lock()
        self.declare_queue(dead_letter_queue(dead_letter_queue_name))

    @property
    def _timeouts(self) -> dict:
        """A publish's limits: the socket write and the wait for the broker's confirm (py-amqp
        waits forever without them, e.g. on a half-open connection or a stalled broker)."""
        return {"timeout": self.confirm_timeout_s, "confirm_timeout": self.confirm_timeout_s}

    def work_queue(self, name: str) -> Queue:
        return work_queue(name, self.dead_letter_queue_name)

    def declare_queue(self, queue: Queue) -> None:
        """Declare ``queue`` (again after a reconnect: kombu forgets its cache then)."""
        with self._publish_lock:
            self._connection.ensure(self._producer, lambda: self._producer.maybe_declare(
                queue), **self._retry)()
            self._publish_down = None

    def publish(self, queue: str, message: Message) -> None:
        self.publish_raw(queue, to_wire(message), message_id=message.message_id)

    def publish_raw(self, queue: str, body: str | bytes, *, message_id: str | None = None,
                    content_type: str = "application/json",
                    headers: dict | None = None) -> None:
        """Publish a body as is to a work queue (declared first); persistent delivery."""
        with self._publish_lock:
            self._producer.publish(
                body, exchange=WORK_EXCHANGE, routing_key=queue, delivery_mode=2,
                content_type=content_type, content_encoding="utf-8",
                message_id=message_id or uuid.uuid4().hex, declare=[self.work_queue(queue)],
                headers=headers or None, retry=True, retry_policy=self._retry, **self._timeouts)
            self._publish_down = None

    def publish_many(self, sends: Sequence[tuple[str, Message]]) -> None:
        """Publish each ``(queue, message)`` in order; returns once the broker has confirmed
        every one (one wait for the whole batch). Raises
        :class:`~mgrpo.bus.confirmed_batch.PublishNotConfirmed` if it did not (a nack, an
        unroutable message, no confirm in time): publish the whole batch again. A lost
        connection is retried like :meth:`publish` (reconnect, the whole batch again)."""
        batch = [Outgoing(self.work_queue(queue), to_wire(message), message.message_id)
                 for queue, message in sends]
        if not batch:
            return
        with self._batch_lock:
            self._batches.connection.ensure(self._batches, self._batches.send,
                                            **self._retry)(batch)
            self._publish_down = None

    def dead_letter(self, queue: str, body: str | bytes, reason: str) -> None:
        """Publish a refused message to the dead-letter queue, keeping why and from where."""
        with self._publish_lock:
            self._producer.publish(
                body, exchange=DLX, routing_key=self.dead_letter_queue_name, delivery_mode=2,
                content_type="application/json", content_encoding="utf-8",
                headers={REASON_HEADER: reason[:4000], SOURCE_QUEUE_HEADER: queue},
                declare=[dead_letter_queue(self.dead_letter_queue_name)], retry=True,
                retry_policy=self._retry, **self._timeouts)
            self._publish_down = None

    def consume(self, queue: str, handler: Handler, *, consumer: str = "",
                dedupe: bool = True) -> None:
        """``dedupe=False``: no duplicate check or claim in the store per message (two
        round trips each), for a handler that is idempotent by itself (the reply queues)."""
        self._start(self.work_queue(queue), handler, consumer or queue, dedupe)

    def announce_weights(self, announcement: WeightsAnnouncement) -> None:
        with self._publish_lock:
            self._producer.publish(to_wire(announcement), exchange=WEIGHTS, routing_key="",
                                   delivery_mode=2, content_type="application/json",
                                   content_encoding="utf-8", declare=[WEIGHTS], retry=True,
                                   retry_policy=self._retry, **self._timeouts)
            self._publish_down = None

    def subscribe_weights(self, handler: Handler, *, consumer: str = "") -> None:
        """Bind a private auto-delete queue to the fanout; it exists while this bus lives."""
        name = f"{WEIGHTS.name}.{consumer or 'sub'}.{uuid.uuid4().hex[:8]}"
        queue = Queue(name, exchange=WEIGHTS, routing_key="", durable=False, auto_delete=True,
                      exclusive=False)
        self.declare_queue(queue)
        self._start(queue, handler, consumer or name)

    def _start(self, queue: Queue, handler: Handler, consumer: str,
               dedupe: bool = True) -> None:
        def on_message(message) -> None:
            outcome = process_payload(message.body, handler,
                                      dedupe=self._dedupe if dedupe else None,
                                      consumer=consumer)
            if outcome.status == "retry":  # not the message's fault: again, after a pause
                self._stop.wait(RETRY_DELAY_S)
                message.requeue()
                return
            if outcome.status == "dead_letter":
                self.dead_letter(queue.name, message.body, outcome.reason or "")
            message.ack()

        self.serve(queue, consumer, on_message, prefetch=1)

    def serve(self, queue: Queue, consumer: str, on_message: Callable, *, prefetch: int,
              timeout_s: Callable[[], float] = lambda: 0.2,
              after_drain: Callable[[bool], None] | None = None,
              on_disconnect: Callable[[], None] | None = None,
              stop: threading.Event | None = None,
              heartbeat_s: float | None = None,
              deadline_s: float | None = None,
              crashes: CrashCounter | None = None,
              holding: Callable[[], list] | None = None) -> threading.Thread:
        """Run a reconnecting consumer of ``queue`` on its own thread (``mgrpo.bus.consumer``);
        returns once it consumes. ``stop`` (default: this bus closing) ends it.
        ``heartbeat_s``: its connection's AMQP heartbeat (default ``consumer.HEARTBEAT_S``).
        ``deadline_s``: its handler deadline (``consumer.HandlerDeadline``; None: none).
        A message that crashed the handler ``consumer.HANDLER_CRASH_LIMIT`` times goes to the
        dead-letter queue with the reason (``crashes``: the count, shared with the caller;
        ``holding``: the messages a crash counts against, ``consumer.serve_queue``)."""
        ready = threading.Event()
        state = ConsumerState(consumer, queue.name)
        stop_event = _Either(stop, self._stop) if stop is not None else self._stop
        thread = threading.Thread(
            target=serve_queue, name=f"bus-{queue.name}", daemon=True,
            args=(self.broker_url, queue),
            kwargs=dict(prefetch=prefetch, state=state, on_message=on_message,
                        stop=stop_event, ready=ready, timeout_s=timeout_s,
                        after_drain=after_drain, on_disconnect=on_disconnect,
                        deadline_s=deadline_s, crashes=crashes, holding=holding,
                        dead_letter=lambda message, reason: self.dead_letter(
                            queue.name, message.body, reason),
                        **({} if heartbeat_s is None else {"heartbeat_s": heartbeat_s})))
        state.thread = thread
        self.consumers.append(state)
        self._threads.append(thread)
        thread.start()
        if not ready.wait(timeout=30):
            raise TimeoutError(f"consumer on {queue.name!r} did not start within 30 s; is "
                               f"RabbitMQ reachable at {self.broker_url}?")
        return thread

    def consumer_problems(self, grace_s: float = 0.0) -> list[str]:
        """Why some consumer of this bus is not consuming: its thread died, or it has been
        disconnected for ``grace_s`` or longer. Empty: every consumer consumes."""
        stopping = self._stop.is_set()
        problems = [problem for state in self.consumers
                    if (problem := state.problem(grace_s, stopping)) is not None]
        down = self._publish_down
        if down is not None and not stopping and time.monotonic() - down[0] >= grace_s:
            problems.append(f"publisher: cannot reach the broker for "
                            f"{time.monotonic() - down[0]:.0f} s ({down[1]})")
        return problems

    def _publish_failed(self, error: BaseException, interval: float) -> None:
        """kombu's errback while a publish retries: remember since when it fails."""
        since = self._publish_down[0] if self._publish_down else time.monotonic()
        self._publish_down = (since, f"{type(error).__name__}: {error}")

    def dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        """Take (and ack) up to ``limit`` messages off the dead-letter queue."""
        return self._dead_letter_pass(limit, lambda letter: "take")[0]

    def peek_dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        """Read up to ``limit`` dead letters and leave them in the queue."""
        return self._dead_letter_pass(limit, lambda letter: "keep")[1]

    def replay_dead_letters(self, limit: int = 1000,
                            source: str | None = None) -> list[DeadLetter]:
        """Publish dead letters back to the queue they came from (only those from ``source``
        when given), as they are: the same body, content type and headers (a Celery task's
        name and id are there) less the dead-lettering ones; returns the replayed ones. The
        others stay dead-lettered. A replayed message was never claimed, so its handler runs;
        one that is still bad
        comes back here with a fresh reason."""
        return self.replay_report(limit, source)[0]

    def replay_report(self, limit: int = 1000, source: str | None = None
                      ) -> tuple[list[DeadLetter], list[DeadLetter], int]:
        """:meth:`replay_dead_letters`, accounted for: (replayed, kept, letters in the queue
        when the pass began). Every letter read is replayed or kept; ``limit`` below that
        count leaves the rest unread."""
        def replay(letter: DeadLetter) -> str:
            if not letter.queue or (source is not None and letter.queue != source):
                return "keep"
            self.publish_raw(letter.queue, letter.raw if letter.raw is not None
                             else letter.body, content_type=letter.content_type,
                             headers=letter.headers)
            return "take"

        taken, seen, count = self._dead_letter_pass(limit, replay)
        replayed = {id(letter) for letter in taken}
        return taken, [letter for letter in seen if id(letter) not in replayed], count

    def _dead_letter_pass(self, limit: int, act: Callable[[DeadLetter], str]
                          ) -> tuple[list[DeadLetter], list[DeadLetter], int]:
        """Get up to ``limit`` dead letters; ``act`` says "take" (ack) or "keep" (left unacked
        until the pass ends, then back in the queue: a basic.get would return it again).
        Returns (letters taken, letters seen, letters in the queue at the start).

        One pass at a time per dead-letter queue (:func:`_hold_pass_lock`): two concurrent
        passes would each miss the letters the other holds unacked, and replay the letters
        the other's replays sent back."""
        taken: list[DeadLetter] = []
        seen: list[DeadLetter] = []
        with Connection(self.broker_url) as connection:
            _hold_pass_lock(connection, self.dead_letter_queue_name, DEAD_LETTER_LOCK_WAIT_S)
            bound = dead_letter_queue(self.dead_letter_queue_name)(connection.channel())
            bound.declare()
            # only what is there now: a replayed letter that fails again comes back meanwhile
            count = bound.queue_declare(passive=True).message_count
            while len(seen) < min(limit, count) and \
                    (message := bound.get(no_ack=False)) is not None:
                letter = _letter(message)
                seen.append(letter)
                if act(letter) == "take":
                    message.ack()
                    taken.append(letter)
        return taken, seen, count

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._connection.release()
        self._batches.close()


RETRY_POLICY = {"max_retries": None, "interval_start": 0.5, "interval_step": 1,
                "interval_max": 5}  # publishes wait out a broker restart


class _Either:
    """``is_set``/``wait`` over two events: a consumer stops with its own event or the bus."""

    def __init__(self, first: threading.Event, second: threading.Event) -> None:
        self.first, self.second = first, second

    def is_set(self) -> bool:
        return self.first.is_set() or self.second.is_set()

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.is_set() and (left := end - time.monotonic()) > 0:
            self.first.wait(min(left, 0.1))
        return self.is_set()


DEAD_LETTER_LOCK_WAIT_S = 120.0  # a second pass waits this long for the first one


class DeadLetterBusy(TransientError):
    """Another pass over the dead-letter queue (``mgrpo dlq``, a replay task) holds its lock:
    try again later."""


def _hold_pass_lock(connection, dead_letter_queue_name: str, wait_s: float) -> None:
    """Declare ``<dead-letter queue>.lock`` EXCLUSIVE on ``connection``: the broker lets one
    connection hold it (another gets RESOURCE_LOCKED) and deletes it when that connection
    closes, a crashed holder's included. Waits up to ``wait_s`` for it."""
    from amqp.exceptions import ResourceLocked

    deadline = time.monotonic() + wait_s
    while True:
        try:
            connection.channel().queue_declare(f"{dead_letter_queue_name}.lock",
                                               exclusive=True, auto_delete=True)
            return
        except ResourceLocked as error:
            if time.monotonic() >= deadline:
                raise DeadLetterBusy(
                    f"another `mgrpo dlq` pass over {dead_letter_queue_name} has held its "
                    f"lock for {wait_s:.0f} s; wait for it to end and try again") from error
            time.sleep(0.2)


def _letter(message) -> DeadLetter:
    headers = message.headers or {}
    reason = headers.get(REASON_HEADER) or _x_death_reason(headers)
    deaths = headers.get("x-death") or [{}]
    source = headers.get(SOURCE_QUEUE_HEADER) or deaths[0].get("queue", "")
    body = message.body.decode("utf-8", "replace") if isinstance(message.body, bytes) \
        else message.body
    kept = {key: value for key, value in headers.items()
            if key not in (REASON_HEADER, SOURCE_QUEUE_HEADER)
            and not key.startswith(("x-death", "x-first-death", "x-last-death"))}
    raw = message.body if isinstance(message.body, bytes) else None
    return DeadLetter(source, body, reason, headers=kept,
                      content_type=message.content_type or "application/json", raw=raw)


def _x_death_reason(headers: dict) -> str:
    """Reason RabbitMQ recorded when IT dead-lettered a message (reject, expiry, ...)."""
    deaths = headers.get("x-death") or []
    if not deaths:
        return "unknown (no reason header)"
    first = deaths[0]
    return f"broker: {first.get('reason')} from queue {first.get('queue')}"
