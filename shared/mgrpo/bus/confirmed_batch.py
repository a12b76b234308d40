"""Publish a batch of messages to RabbitMQ and wait for the broker's confirms ONCE per batch.

:meth:`mgrpo.bus.kombu_bus.KombuBus.publish` waits for each message's publisher confirm (one
broker round trip per message). A :class:`ConfirmedBatches` keeps its own connection whose
channel is in confirm mode (``confirm.select``), publishes a whole batch without waiting,
then reads the broker's acks until every message of the batch is confirmed (RabbitMQ may
ack several at once, ``multiple``). Every message is ``mandatory``: one the broker cannot
route to a queue (its queue was deleted after we declared it) comes back as a
``basic.return`` instead of vanishing.

Failure handling: a batch is all-or-raise. A nack, a returned (unroutable) message or no
confirm within ``timeout_s`` raises :class:`PublishNotConfirmed` after the channel is
replaced (late acks of a failed batch must not count for the next one) and the declaration
cache cleared (a retry declares its queues again). The caller retries the WHOLE batch;
messages that did get through are then delivered twice, which consumers recognise by their
idempotency key (``mgrpo.bus.handler``, ``mgrpo.services.batching``; trainer ingestion is
``INSERT ... ON CONFLICT DO NOTHING``). :class:`PublishNotConfirmed` is transient
(``mgrpo.bus.errors``): a worker whose handler raises it gets its input requeued, so the
batch is published again. A lost connection is not this error: the owner runs
:meth:`ConfirmedBatches.send` under kombu's ``ensure`` (reconnect, :meth:`revive`, send the
whole batch again), as single publishes do.

Measured on the local broker (``bench/publish.py``, 8 KB trajectory messages): a batch of
24 or 64 takes 0.3-0.4x the time of the same messages confirmed one by one; one AMQP
transaction per batch (``tx.select``/``tx.commit``) took the same time as the batched
confirms (0.92-0.98x, within the quartiles). Confirms are kept: RabbitMQ's mechanism for
publisher reliability, with a nack or return per message and no transaction to roll back.

What this module does NOT do: locking (the owner serialises batches) or retries.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kombu import Connection, Producer, Queue

from mgrpo.bus.topology import WORK_EXCHANGE
from mgrpo.errors import TransientError


class PublishNotConfirmed(TransientError):
    """The broker did not confirm every message of a batch (nack, unroutable, timeout):
    publish the whole batch again. Not an ``OSError``: kombu's ``ensure`` would take it for
    a lost connection and retry by itself; it is the caller's to retry."""


@dataclass
class _Pending:
    """Delivery tags of the batch in flight, and what the broker refused of it."""

    tags: set[int] = field(default_factory=set)
    nacked: int = 0
    returned: list[str] = field(default_factory=list)  # routing keys of returned messages

    def ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self.tags = {t for t in self.tags if t > tag}
        else:
            self.tags.discard(tag)

    def nack(self, tag: int, multiple: bool) -> None:
        before = len(self.tags)
        self.ack(tag, multiple)
        self.nacked += before - len(self.tags)


@dataclass(frozen=True)
class Outgoing:
    """One message of a batch: a wire body for a work queue (declared before publishing)."""

    queue: Queue
    body: str | bytes
    message_id: str


class ConfirmedBatches:
    """A connection for batches; :meth:`send` publishes one and waits for its confirms."""

    def __init__(self, broker_url: str, timeout_s: float = 30.0) -> None:
        self.connection = Connection(broker_url)
        self.timeout_s = timeout_s
        self._producer: Producer | None = None
        self._published = 0  # delivery tags used on the current channel
        self._pending = _Pending()

    def revive(self, channel) -> None:
        """kombu's ``ensure`` after a reconnect: a fresh confirm-mode channel."""
        self._open(channel)

    def _open(self, channel=None) -> Producer:
        channel = channel if channel is not None else self.connection.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(lambda tag, multiple: self._pending.ack(tag, multiple))
        channel.events["basic_nack"].add(lambda tag, multiple: self._pending.nack(tag, multiple))
        self._producer = Producer(channel, on_return=self._on_return)
        self._published = 0
        return self._producer

    def _on_return(self, exception, exchange, routing_key, message) -> None:
        self._pending.returned.append(routing_key)

    def send(self, batch: Sequence[Outgoing]) -> None:
        """Publish ``batch`` in order and wait until the broker confirms all of it; raises
        :class:`PublishNotConfirmed` (see the module docstring) or a connection error."""
        if not batch:
            return
        producer = self._producer or self._open()
        self._pending = _Pending()
        try:
            for item in batch:
                producer.publish(
                    item.body, exchange=WORK_EXCHANGE, routing_key=item.queue.routing_key,
                    delivery_mode=2, content_type="application/json",
                    content_encoding="utf-8", message_id=item.message_id, mandatory=True,
                    declare=[item.queue])
                self._published += 1
                self._pending.tags.add(self._published)
            self._wait()
        except PublishNotConfirmed:
            self._drop_connection()  # no confirm in time: the broker may not answer at all
            raise
        pending = self._pending
        if pending.nacked or pending.returned:
            self._discard_channel()
            raise PublishNotConfirmed(
                f"{pending.nacked} of {len(batch)} messages nacked by the broker, "
                f"{len(pending.returned)} unroutable (no queue bound for "
                f"{sorted(set(pending.returned))}); publish the batch again")

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self._pending.tags:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PublishNotConfirmed(
                    f"{len(self._pending.tags)} messages not confirmed within "
                    f"{self.timeout_s:.0f} s; publish the batch again")
            try:
                self.connection.drain_events(timeout=left)
            except TimeoutError:
                continue  # the deadline check above decides

    def _discard_channel(self) -> None:
        """Forget the channel (late acks of a failed batch land on a closed one) and the
        declarations (a retry declares its queues again)."""
        producer, self._producer = self._producer, None
        self.connection.declared_entities.clear()
        if producer is not None:
            with contextlib.suppress(Exception):  # already broken: the reconnect handles it
                producer.channel.close()

    def _drop_connection(self) -> None:
        """Forget the channel and close the connection's socket without a handshake (a
        channel close would wait for the broker's close-ok, forever if it is silent); the
        next send connects again."""
        self._producer = None
        self.connection.declared_entities.clear()
        with contextlib.suppress(Exception):
            self.connection.collect()

    def close(self) -> None:
        self.connection.release()
