"""What a worker needs besides its bus consumers, for its ``/readyz``: the store answers, and
the sandbox service answers where the worker calls one. Each check gives None or one line
saying what is wrong; a probe runs them (bounded: 2 s for the sandbox; the store's own
connect timeout), so a worker turns 503 within one probe of losing one.

What this module does NOT do: check the broker (the bus consumers do:
``KombuBus.consumer_problems``) or restart anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable

SANDBOX_TIMEOUT_S = 2.0


def _line(error: BaseException) -> str:
    text = re.sub(r"\s+", " ", str(error)).strip()[:300]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def store_problem(store) -> str | None:
    """None when the store answers a query; else why not."""
    try:
        store.current_revision()
    except Exception as error:  # noqa: BLE001 - any failure means not ready; say which
        return f"store: the database does not answer ({_line(error)})"
    return None


def sandbox_problem(url: str | None, timeout_s: float = SANDBOX_TIMEOUT_S) -> str | None:
    """None when the sandbox service at ``url`` is ready (its ``/readyz``, or ``/healthz``
    for a service without one) or no sandbox is used (``url`` None); else why not."""
    if not url:
        return None
    import httpx

    base = url.rstrip("/")
    try:
        response = httpx.get(f"{base}/readyz", timeout=timeout_s)
        if response.status_code == 404:
            response = httpx.get(f"{base}/healthz", timeout=timeout_s)
    except httpx.HTTPError as error:
        return f"sandbox: {base} does not answer ({_line(error)})"
    if response.status_code != 200:
        return f"sandbox: {base} is not ready ({response.status_code}: {response.text[:200]})"
    return None


def readiness(*checks: Callable[[], str | None]) -> Callable[[], list[str]]:
    """One ``not_ready`` callable over several checks: the problems they found."""
    return lambda: [problem for check in checks if (problem := check()) is not None]


def worker_needs(store, sandbox_url: str | None = None) -> Callable[[], list[str]]:
    """A worker's needs for its ``/readyz``: the store, and the sandbox service at
    ``sandbox_url`` (pass it only where the worker runs code there)."""
    return readiness(lambda: store_problem(store), lambda: sandbox_problem(sandbox_url))
