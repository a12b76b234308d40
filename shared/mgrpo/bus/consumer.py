"""One RabbitMQ consumer that outlives its connection: connect, declare, consume, and on ANY
connection failure (broker restart, ``rabbitmqctl stop_app``, a reset socket, a missed
heartbeat) reconnect with a capped backoff and consume again, until told to stop.

Why a loop of our own and not ``kombu.mixins.ConsumerMixin``: the batch consumer must run its
batch between ``drain_events`` calls and drop the messages of a dead channel (the broker
redelivers them), so it needs the same hooks here as the one-message consumer.

After a reconnect the queue is declared again (``Consumer`` declares on consume), so an
auto-delete reply queue that died with the old connection comes back. Messages that were
unacked on the dead connection are redelivered by the broker; their idempotency keys make the
redelivery an ack-only duplicate when the handler had finished (``mgrpo.bus.handler``).

:class:`ConsumerState` is what health checks read: consuming or not, since when, and why not;
a consumer that keeps reconnecting (:data:`FLAP_LIMIT` times within :data:`FLAP_WINDOW_S`) is
a liveness problem even in the moments it consumes: it makes no progress.

A handler crash is not a lost connection. An exception out of ``on_message`` or
``after_drain`` that is no connection failure (:func:`is_lost_connection`) counts a crash for
every message in hand and unacked (:class:`CrashCounter`, keyed by the body's digest), then the
consumer reconnects so the broker redelivers them. A message delivered again after
:data:`HANDLER_CRASH_LIMIT` crashes goes to the dead-letter queue with the last error instead of
to the handler: one poison message never loops forever. The count is per process: a message
that kills the whole process is bounded by the orchestrator's restart back-off, not here.

A handler deadline (``deadline_s``, the workers' ``MGRPO_HANDLER_DEADLINE_S``): when one pass
of the consume loop (a drain and the batch handler after it) runs longer, the handler is taken
as hung (a stuck engine, a call that never returns): :class:`HandlerDeadline` shuts the
consumer's socket from its own thread, so the broker requeues the unacked messages at once for
another consumer, and marks the consumer down with the reason (``/readyz`` 503 at once,
``/healthz`` 503 after the grace period: an orchestrator restarts the process). A handler that
returns after all finds its channel gone: its acks fail and the consumer reconnects. Without
it, a hung handler keeps its prefetched messages until the broker misses ~2 AMQP heartbeats
(:data:`HEARTBEAT_S`: about 4 minutes).

What this module does NOT do: decide what happens to a message (``on_message`` does).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import amqp.exceptions
import kombu.exceptions
from kombu import Connection, Consumer, Queue

from mgrpo.bus.errors import is_transient

log = logging.getLogger(__name__)

RECONNECT_MAX_DELAY_S = 2.0
# AMQP heartbeat of consumer connections: a silently dead broker (a partition, not a restart:
# a restart closes the socket and is noticed at once) is noticed within ~2 intervals. Heartbeats
# are sent between drains only, so a handler that runs longer than that loses the connection and
# its messages are redelivered (an ack-only duplicate once claimed): keep it well above a batch.
HEARTBEAT_S = 120
HANDLER_CRASH_LIMIT = 3  # crashes of its handler after which a message is dead-lettered
FLAP_LIMIT = 10  # reconnects within FLAP_WINDOW_S: the consumer makes no progress
FLAP_WINDOW_S = 60.0


def is_lost_connection(error: BaseException) -> bool:
    """True for a failure of the broker connection (socket, AMQP, kombu), or any other
    infrastructure failure (``mgrpo.bus.errors``): reconnect. False: a handler crashed."""
    return isinstance(error, OSError | amqp.exceptions.AMQPError | kombu.exceptions.KombuError
                      ) or is_transient(error)


def delivery_key(body: bytes | str) -> str:
    """What identifies a delivery across redeliveries: the digest of its body."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class CrashCounter:
    """How many times each message (:func:`delivery_key`) was in hand when its handler
    crashed, and the last error; remembers the newest :attr:`LIMIT` messages."""

    LIMIT = 10_000

    def __init__(self, limit: int = HANDLER_CRASH_LIMIT) -> None:
        self.limit = limit
        self._counts: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def crashed(self, keys, error: BaseException) -> None:
        why = f"{type(error).__name__}: {error}"[:1000]
        with self._lock:
            for key in keys:
                count = self._counts.pop(key, (0, ""))[0] + 1
                self._counts[key] = (count, why)
            while len(self._counts) > self.LIMIT:
                self._counts.popitem(last=False)

    def count(self, key: str) -> int:
        with self._lock:
            return self._counts.get(key, (0, ""))[0]

    def verdict(self, key: str) -> str | None:
        """The dead-letter reason of a message that crashed its handler too often (None:
        handle it)."""
        with self._lock:
            count, why = self._counts.get(key, (0, ""))
        if count < self.limit:
            return None
        return (f"poison message: its handler crashed {count} times while holding it "
                f"(HANDLER_CRASH_LIMIT {self.limit}); last error: {why}")

    def forget(self, key: str) -> None:
        with self._lock:
            self._counts.pop(key, None)


@dataclass
class ConsumerState:
    """Health of one consumer: ``consuming`` is True only while its channel consumes."""

    name: str
    queue: str
    consuming: bool = False
    since: float = field(default_factory=time.monotonic)  # of the current state
    last_error: str | None = None
    reconnects: int = 0
    thread: threading.Thread | None = None
    stopped: bool = False  # told to stop: no longer a health problem
    crashes: int = 0  # handler crashes (exceptions that were no connection failure)
    recent_reconnects: deque = field(default_factory=lambda: deque(maxlen=FLAP_LIMIT))

    def up(self) -> None:
        if not self.consuming:
            self.consuming, self.since = True, time.monotonic()

    def down(self, error: BaseException | str) -> None:
        self.last_error = error if isinstance(error, str) else \
            f"{type(error).__name__}: {error}"
        if self.consuming:
            self.consuming, self.since = False, time.monotonic()

    def reconnected(self) -> None:
        self.reconnects += 1
        self.recent_reconnects.append(time.monotonic())

    def flapping(self) -> bool:
        recent = self.recent_reconnects
        return len(recent) >= FLAP_LIMIT and time.monotonic() - recent[0] <= FLAP_WINDOW_S

    def problem(self, grace_s: float = 0.0, stopping: bool = False) -> str | None:
        """Why this consumer is unhealthy (None: it is fine). ``grace_s``: how long it may be
        reconnecting before that counts."""
        if stopping or self.stopped:
            return None
        if self.thread is not None and not self.thread.is_alive():
            return f"consumer {self.name} on {self.queue}: thread is dead ({self.last_error})"
        if self.flapping():
            return (f"consumer {self.name} on {self.queue}: reconnected {FLAP_LIMIT} times in "
                    f"{FLAP_WINDOW_S:.0f} s, makes no progress ({self.last_error})")
        down_s = time.monotonic() - self.since
        if not self.consuming and down_s >= grace_s:
            return (f"consumer {self.name} on {self.queue}: not consuming for {down_s:.0f} s "
                    f"({self.last_error or 'connecting'})")
        return None


class HandlerDeadline:
    """Watch one consumer's loop: :meth:`enter` at the start of a pass, :meth:`leave` at its
    end; a pass longer than ``deadline_s`` cuts the connection (see the module docstring).
    Checks on its own daemon thread, every ``deadline_s / 10`` (at most 1 s)."""

    def __init__(self, deadline_s: float, state: ConsumerState, stop) -> None:
        if deadline_s <= 0:
            raise ValueError(f"handler deadline must be > 0 s, got {deadline_s}")
        self.deadline_s, self.state, self.stop = deadline_s, state, stop
        self._since: float | None = None
        self._connection = None
        self._lock = threading.Lock()
        self.cuts = 0  # connections cut for a hung handler
        threading.Thread(target=self._watch, name=f"deadline-{state.name}",
                         daemon=True).start()

    def enter(self, connection) -> None:
        with self._lock:
            self._since, self._connection = time.monotonic(), connection

    def leave(self) -> None:
        with self._lock:
            self._since = self._connection = None

    def _watch(self) -> None:
        period = min(1.0, self.deadline_s / 10)
        while not self.stop.wait(period):
            with self._lock:
                since, connection = self._since, self._connection
                if since is None or time.monotonic() - since < self.deadline_s:
                    continue
                self._since = self._connection = None  # one cut per pass
            self._cut(connection, time.monotonic() - since)

    def _cut(self, connection, ran_s: float) -> None:
        reason = (f"handler hung: running for {ran_s:.0f} s, past the {self.deadline_s:.0f} s "
                  "deadline (MGRPO_HANDLER_DEADLINE_S); connection closed so the broker "
                  "redelivers its messages")
        log.error("consumer %s on %s: %s", self.state.name, self.state.queue, reason)
        self.state.down(reason)
        self.cuts += 1
        try:  # the socket only: a shutdown is safe while another thread is in a call on it
            connection.connection.transport.sock.shutdown(socket.SHUT_RDWR)
        except Exception as error:  # noqa: BLE001 - already closed, another transport
            log.warning("consumer %s: could not shut its socket (%s: %s)", self.state.name,
                        type(error).__name__, error)


def serve_queue(broker_url: str, queue: Queue, *, prefetch: int, state: ConsumerState,
                on_message: Callable, stop: threading.Event, ready: threading.Event,
                timeout_s: Callable[[], float] = lambda: 0.2,
                after_drain: Callable[[bool], None] | None = None,
                on_disconnect: Callable[[], None] | None = None,
                heartbeat_s: float = HEARTBEAT_S, deadline_s: float | None = None,
                dead_letter: Callable[[object, str], None] | None = None,
                crashes: CrashCounter | None = None,
                holding: Callable[[], list] | None = None) -> None:
    """Consume ``queue`` until ``stop``; reconnects forever on connection errors.

    ``after_drain(timed_out)`` runs after every drain (the batch consumer flushes there);
    ``on_disconnect`` runs when a connection is lost (drop messages of the dead channel).
    ``deadline_s``: the handler deadline (:class:`HandlerDeadline`; None: none).
    ``dead_letter(message, reason)``: where a poison message goes (then it is acked; None:
    rejected without requeue, so the broker dead-letters it); ``crashes``: the count of
    handler crashes per message (:class:`CrashCounter`; None: a new one). ``holding()``: the
    messages the handler was working on when it crashed (a batch consumer's current batch;
    None or empty: every unacked message in hand).
    """
    deadline = HandlerDeadline(deadline_s, state, stop) if deadline_s is not None else None
    crashes = crashes if crashes is not None else CrashCounter()
    in_hand: dict[str, object] = {}  # this connection's deliveries, by delivery_key

    def receive(message) -> None:
        key = delivery_key(message.body)
        reason = crashes.verdict(key)
        if reason is not None:
            log.error("consumer %s on %s: %s", state.name, queue.name, reason)
            if dead_letter is not None:
                dead_letter(message, reason)
                message.ack()
            else:
                message.reject(requeue=False)
            crashes.forget(key)
            return
        in_hand[key] = message
        on_message(message)

    delay = 0.2
    while not stop.is_set():
        in_hand.clear()
        try:
            with Connection(broker_url, heartbeat=heartbeat_s) as connection:
                connection.connect()
                channel = connection.channel()
                channel.basic_qos(prefetch_size=0, prefetch_count=prefetch, a_global=False)
                # on_message gets the raw body (kombu does not deserialize it): the handler
                # decodes it as JSON itself, so nothing is ever unpickled.
                with Consumer(channel, queues=[queue], on_message=receive, no_ack=False,
                              accept=["json"], prefetch_count=prefetch):
                    state.up()
                    ready.set()
                    delay = 0.2
                    if state.reconnects:
                        log.info("consumer %s: consuming %s again", state.name, queue.name)
                    while not stop.is_set():
                        timed_out = False
                        if deadline is not None:
                            deadline.enter(connection)
                        try:
                            connection.drain_events(timeout=timeout_s())
                        except TimeoutError:
                            timed_out = True
                        connection.heartbeat_check()
                        if after_drain is not None:
                            after_drain(timed_out)
                        if deadline is not None:
                            deadline.leave()
                        for key in [k for k, m in in_hand.items() if m.acknowledged]:
                            del in_hand[key]
        except Exception as error:  # noqa: BLE001 - connection errors of every transport
            if deadline is not None:
                deadline.leave()
            if stop.is_set():
                break
            if not is_lost_connection(error):  # the handler crashed, not the connection
                held = [delivery_key(message.body) for message in (holding() if holding
                                                                   else None) or ()]
                held = held or [key for key, message in in_hand.items()
                                if not message.acknowledged]
                crashes.crashed(held, error)
                state.crashes += 1
                log.exception("consumer %s on %s: handler crashed holding %d message(s); "
                              "they are redelivered, and dead-lettered after %d crashes",
                              state.name, queue.name, len(held), crashes.limit)
            else:
                log.warning("consumer %s on %s lost its connection (%s: %s); reconnecting in "
                            "%.1f s", state.name, queue.name, type(error).__name__, error,
                            delay)
            state.down(error)
            state.reconnected()
            if on_disconnect is not None:
                on_disconnect()
            stop.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_DELAY_S)
    state.down("stopped")
    state.stopped = True
