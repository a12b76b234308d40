"""The :class:`~mgrpo.bus.transport.Bus` interface on RabbitMQ (kombu), for distributed mode.

Delivery rules (SPEC 2.3): durable queues, persistent messages, JSON bodies, prefetch 1, ack
AFTER the handler (late ack), so a worker that dies mid-message gets it redelivered; a
redelivered message whose key was already claimed is acked without re-running the handler
(:func:`mgrpo.bus.handler.process_payload`). A message we refuse (undecodable, or its handler
raised) is published to the dead-letter queue with the reason in the ``x-mgrpo-reason``
header and the source queue in ``x-mgrpo-source-queue``, then acked.

Each consumer runs on its own thread with its own connection (kombu connections are not
thread-safe); publishing shares one connection behind a lock.

What this module does NOT do: run Celery tasks (``mgrpo.bus.app``) or retry handlers.
"""

from __future__ import annotations

import logging
import threading
import uuid

from kombu import Connection, Consumer, Producer, Queue

from mgrpo.bus.handler import Dedupe, Handler, process_payload
from mgrpo.bus.messages import Message, WeightsAnnouncement
from mgrpo.bus.names import DEAD_LETTER_QUEUE, REASON_HEADER, SOURCE_QUEUE_HEADER
from mgrpo.bus.topology import DLX, WEIGHTS, WORK_EXCHANGE, dead_letter_queue, work_queue
from mgrpo.bus.transport import DeadLetter, to_wire

log = logging.getLogger(__name__)


class KombuBus:
    def __init__(self, broker_url: str, dedupe: Dedupe | None = None, *,
                 dead_letter_queue_name: str = DEAD_LETTER_QUEUE) -> None:
        self.broker_url = broker_url
        self.dead_letter_queue_name = dead_letter_queue_name
        self._dedupe = dedupe
        self._publish_lock = threading.Lock()
        self._connection = Connection(broker_url)
        self._producer = Producer(self._connection.channel())
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._declared: set[str] = set()
        self.declare_queue(dead_letter_queue(dead_letter_queue_name))

    def work_queue(self, name: str) -> Queue:
        return work_queue(name, self.dead_letter_queue_name)

    def declare_queue(self, queue: Queue) -> None:
        with self._publish_lock:
            if queue.name not in self._declared:
                queue(self._producer.channel).declare()
                self._declared.add(queue.name)

    def publish(self, queue: str, message: Message) -> None:
        self.publish_raw(queue, to_wire(message), message_id=message.message_id)

    def publish_raw(self, queue: str, body: str | bytes, *, message_id: str | None = None,
                    content_type: str = "application/json") -> None:
        """Publish a body as is to a work queue (declared first); persistent delivery."""
        self.declare_queue(self.work_queue(queue))
        with self._publish_lock:
            self._producer.publish(
                body, exchange=WORK_EXCHANGE, routing_key=queue, delivery_mode=2,
                content_type=content_type, content_encoding="utf-8",
                message_id=message_id or uuid.uuid4().hex, retry=True)

    def dead_letter(self, queue: str, body: str | bytes, reason: str) -> None:
        """Publish a refused message to the dead-letter queue, keeping why and from where."""
        with self._publish_lock:
            self._producer.publish(
                body, exchange=DLX, routing_key=self.dead_letter_queue_name, delivery_mode=2,
                content_type="application/json", content_encoding="utf-8",
                headers={REASON_HEADER: reason[:4000], SOURCE_QUEUE_HEADER: queue}, retry=True)

    def consume(self, queue: str, handler: Handler, *, consumer: str = "") -> None:
        self._start(self.work_queue(queue), handler, consumer or queue)

    def announce_weights(self, announcement: WeightsAnnouncement) -> None:
        with self._publish_lock:
            self._producer.publish(to_wire(announcement), exchange=WEIGHTS, routing_key="",
                                   delivery_mode=2, content_type="application/json",
                                   content_encoding="utf-8", declare=[WEIGHTS], retry=True)

    def subscribe_weights(self, handler: Handler, *, consumer: str = "") -> None:
        """Bind a private auto-delete queue to the fanout; it exists while this bus lives."""
        name = f"{WEIGHTS.name}.{consumer or 'sub'}.{uuid.uuid4().hex[:8]}"
        queue = Queue(name, exchange=WEIGHTS, routing_key="", durable=False, auto_delete=True,
                      exclusive=False)
        self.declare_queue(queue)
        self._start(queue, handler, consumer or name)

    def _start(self, queue: Queue, handler: Handler, consumer: str) -> None:
        ready = threading.Event()
        thread = threading.Thread(target=self._work, args=(queue, handler, consumer, ready),
                                  name=f"bus-{queue.name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        if not ready.wait(timeout=30):
            raise TimeoutError(f"consumer on {queue.name!r} did not start within 30 s; is "
                               f"RabbitMQ reachable at {self.broker_url}?")

    def _work(self, queue: Queue, handler: Handler, consumer: str,
              ready: threading.Event) -> None:
        def on_message(message) -> None:
            outcome = process_payload(message.body, handler, dedupe=self._dedupe,
                                      consumer=consumer)
            if outcome.status == "dead_letter":
                self.dead_letter(queue.name, message.body, outcome.reason or "")
            message.ack()

        with Connection(self.broker_url) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_size=0, prefetch_count=1, a_global=False)
            # on_message gets the raw body (kombu does not deserialize it): we decode it
            # ourselves as JSON, so nothing is ever unpickled and garbage reaches the DLQ.
            with Consumer(channel, queues=[queue], on_message=on_message, no_ack=False,
                          accept=["json"], prefetch_count=1):
                ready.set()
                while not self._stop.is_set():
                    try:
                        connection.drain_events(timeout=0.2)
                    except TimeoutError:
                        continue

    def dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        """Take (and ack) up to ``limit`` messages off the dead-letter queue."""
        letters: list[DeadLetter] = []
        with Connection(self.broker_url) as connection:
            bound = dead_letter_queue(self.dead_letter_queue_name)(connection.channel())
            while len(letters) < limit and (message := bound.get(no_ack=False)) is not None:
                headers = message.headers or {}
                reason = headers.get(REASON_HEADER) or _x_death_reason(headers)
                deaths = headers.get("x-death") or [{}]
                source = headers.get(SOURCE_QUEUE_HEADER) or deaths[0].get("queue", "")
                letters.append(DeadLetter(source,
                                          message.body.decode("utf-8", "replace")
                                          if isinstance(message.body, bytes) else message.body,
                                          reason))
                message.ack()
        return letters

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._connection.release()


def _x_death_reason(headers: dict) -> str:
    """Reason RabbitMQ recorded when IT dead-lettered a message (reject, expiry, ...)."""
    deaths = headers.get("x-death") or []
    if not deaths:
        return "unknown (no reason header)"
    first = deaths[0]
    return f"broker: {first.get('reason')} from queue {first.get('queue')}"
