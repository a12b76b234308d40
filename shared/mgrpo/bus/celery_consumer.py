"""The Celery worker's consumer of every mgrpo app: Celery's own, except that a message whose
body cannot be decoded (not UTF-8, not JSON: Celery's ``on_decode_error``) goes to the
deployment's dead-letter queue with the reason, its body, headers and content type as they
came, instead of being acked and discarded. Unknown messages and unknown tasks are rejected
without requeue as Celery does, so the broker dead-letters them (``x-death``).

What this module does NOT do: start workers (``mgrpo.services.entrypoints``) or hold tasks.
"""

from __future__ import annotations

import logging

from celery.worker.consumer import Consumer

from mgrpo.bus.names import REASON_HEADER, SOURCE_QUEUE_HEADER
from mgrpo.bus.topology import DLX, dead_letter_queue

log = logging.getLogger(__name__)


class DeadLetteringConsumer(Consumer):
    def on_decode_error(self, message, exc) -> None:
        source = (message.delivery_info or {}).get("routing_key", "")
        reason = (f"undecodable message: Celery could not decode its body "
                  f"({message.content_type}, {message.content_encoding}): "
                  f"{type(exc).__name__}: {exc}")[:4000]
        log.error("%s on %s; dead-lettered", reason, source)
        dlq = self.app.conf.mgrpo_dead_letter_queue
        with self.app.producer_or_acquire() as producer:
            producer.publish(message.body, exchange=DLX, routing_key=dlq, delivery_mode=2,
                             content_type=message.content_type or "application/octet-stream",
                             content_encoding=message.content_encoding or "binary",
                             headers={**(message.headers or {}), REASON_HEADER: reason,
                                      SOURCE_QUEUE_HEADER: source},
                             declare=[dead_letter_queue(dlq)], retry=True)
        message.ack()
