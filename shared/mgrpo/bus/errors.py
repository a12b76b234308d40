"""Transient failures versus bad messages: what a consumer does with a handler's exception.

- transient (:func:`is_transient`): our infrastructure failed, not the message: the broker
  connection dropped; a judge or engine server cannot be reached or timed out (httpx's
  transport errors, after ``mgrpo.retry``'s back-off); any room's
  :class:`~mgrpo.errors.TransientError` (the sandbox service is down; a batch of publishes the
  broker did not confirm, ``PublishNotConfirmed``, whose retry publishes it again); or a
  failure a room registered as transient (the database restarted or is unreachable:
  ``mgrpo.store.errors``). The message is requeued after a pause and handled again later;
  its idempotency key is not claimed, so the retry runs the handler.
- anything else: the message cannot be handled (wrong kind, wrong model, unknown query): it goes
  to the dead-letter queue with the reason, alone.

The explicit cause chain (``raise ... from``) is searched, so a wrapped database error still
counts as transient; an implicit context is not (an error raised WHILE handling a database
error is its own error).

What this module does NOT do: sleep, requeue or publish (the consumers do).
"""

from __future__ import annotations

from mgrpo.errors import is_transient_here

RETRY_DELAY_S = 2.0  # pause before a requeued message comes back: no hot loop during an outage


def _transient_types() -> tuple[type[BaseException], ...]:
    # on use: keeps httpx out of this module's import
    import amqp.exceptions
    import kombu.exceptions

    from mgrpo.retry import RETRIED

    return (ConnectionError, TimeoutError, kombu.exceptions.OperationalError,
            amqp.exceptions.RecoverableConnectionError, amqp.exceptions.ConnectionForced,
            *RETRIED)


def is_transient(error: BaseException) -> bool:
    """True when ``error`` (or an exception it was raised from) is an infrastructure failure."""
    types = _transient_types()
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, types) or is_transient_here(current):
            return True
        current = current.__cause__
    return False
