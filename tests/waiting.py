"""The polling wait the tests share (importable from every test: ``tests/`` is on sys.path
through the root conftest)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float = 120.0, poll_s: float = 0.05):
    """Polls ``predicate`` until it is true (then True) or ``timeout_s`` has passed (then its
    last answer). The timeout is a bound for a failing test, not a pace: a passing wait ends at
    the first true answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()
