"""Retry an HTTP call through a short outage of the server it talks to (a judge or engine
server restarting), with exponential back-off.

Only transport failures are retried (:data:`RETRIED`: the connection refused or reset, a
connect or read timeout): the request never reached a working server, so sending it again is
safe for the idempotent generation calls made here. An HTTP error status is the server's
answer and is not retried. After the last attempt the error propagates; the bus treats it as
transient (``mgrpo.bus.errors``), so the message is requeued rather than dead-lettered.

What it does NOT do: retry non-idempotent calls (weight loads), or wait longer than about
``first_delay_s * 2**attempts`` in all (4 s by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

log = logging.getLogger(__name__)
T = TypeVar("T")
_sleep = time.sleep  # the default wait (tests replace it)

RETRIED: tuple[type[BaseException], ...] = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, httpx.RemoteProtocolError,
    httpx.PoolTimeout, httpx.ReadError, httpx.WriteError)


def call_with_backoff(call: Callable[[], T], *, attempts: int = 5, first_delay_s: float = 0.25,
                      max_delay_s: float = 4.0, what: str = "request",
                      sleep: Callable[[float], None] | None = None) -> T:
    """``call()``, retried up to ``attempts`` times in all on :data:`RETRIED` errors, waiting
    ``first_delay_s``, then twice as long each time (at most ``max_delay_s``)."""
    sleep = sleep or _sleep
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except RETRIED as error:
            if attempt == attempts:
                raise
            log.warning("%s failed (%s: %s), attempt %d of %d; retrying in %.2f s", what,
                        type(error).__name__, error, attempt, attempts, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
    raise AssertionError("unreachable")
