"""HTTP client of the sandbox service: :class:`SandboxClient`, same interface as LocalSandbox.

It does NOT run code itself and does not fall back to a local sandbox when the service is
down: it raises :class:`SandboxUnavailable`, because silently running model code unsandboxed
(or with other limits) would be worse than failing.
"""

from __future__ import annotations

import json
import time

import httpx

from mgrpo.errors import TransientError
from mgrpo.sandbox.types import ExecRequest, ExecResult


class SandboxUnavailable(TransientError):
    """The service could not run the call (down, overloaded past retries, or bad reply)."""


class SandboxClient:
    """``SandboxClient(base_url, timeout).execute(ExecRequest) -> ExecResult``.

    ``timeout`` (s) is added to each request's own ``timeout_s`` for the HTTP deadline.
    A 429 (queue full) is retried ``busy_retries`` times with exponential back-off.
    """

    def __init__(self, base_url: str, timeout: float = 10.0, busy_retries: int = 5,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.busy_retries = busy_retries
        self._http = httpx.Client(base_url=self.base_url, transport=transport)

    def execute(self, request: ExecRequest) -> ExecResult:
        # json.dumps escapes lone surrogates (\\ud800) that a UTF-8 encoder would reject.
        body = json.dumps(request.model_dump()).encode("ascii")
        for attempt in range(self.busy_retries + 1):
            try:
                resp = self._http.post("/v1/execute", content=body,
                                       headers={"content-type": "application/json"},
                                       timeout=request.timeout_s + self.timeout)
            except httpx.HTTPError as err:
                raise SandboxUnavailable(
                    f"sandbox service at {self.base_url} unreachable: {err!r}; "
                    "check MGRPO_SANDBOX_URL and that `mgrpo serve sandbox` runs") from err
            if resp.status_code == 429 and attempt < self.busy_retries:
                time.sleep(min(2.0, 0.05 * 2**attempt))
                continue
            if resp.status_code != 200:
                raise SandboxUnavailable(
                    f"sandbox service answered {resp.status_code}: {resp.text[:500]}")
            return ExecResult.model_validate(resp.json())
        raise AssertionError("unreachable")  # the loop returns or raises

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
