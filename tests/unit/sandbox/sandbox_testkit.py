"""Helpers for the sandbox tests (a plain module: conftest files are not importable)."""

from __future__ import annotations

import contextlib
import os

import httpx
import pytest

from mgrpo.sandbox.client import SandboxClient
from mgrpo.sandbox.isolation import JAIL_MODES, detect_isolation, mode_works
from mgrpo.sandbox.local import SandboxLimits
from mgrpo.sandbox.types import ExecRequest, ExecResult

# MGRPO_TEST_SANDBOX_URL: run the hostile suite against that running sandbox service (the
# live deployment tier points it at the sandbox container) instead of in-process sandboxes.
REMOTE_URL = os.environ.get("MGRPO_TEST_SANDBOX_URL")


class RemoteSandbox:
    """The ``sandbox`` fixture over HTTP: ``execute`` through :class:`SandboxClient`, the
    service's default limits, its isolation mode from ``/healthz``. The service there runs
    as a non-root user (the image's 10001), so calls keep that uid: no per-call uid."""

    per_call_uid = False

    def __init__(self, url: str) -> None:
        self.client = SandboxClient(url, timeout=60)
        self.limits = SandboxLimits()
        self.mode = httpx.get(f"{url}/healthz", timeout=10).json()["isolation"]

    def execute(self, request: ExecRequest) -> ExecResult:
        return self.client.execute(request)


def _modes() -> list[str]:
    if REMOTE_URL:
        return [RemoteSandbox(REMOTE_URL).mode]
    # Once per jail mode this host has ("bwrap", "root"); with neither, once in the detected
    # weaker mode, where the tests that need a jail are skipped.
    return [m for m in JAIL_MODES if mode_works(m)] or [detect_isolation()]


SANDBOX_MODES = _modes()
needs_jail = pytest.mark.skipif(
    not any(m in JAIL_MODES for m in SANDBOX_MODES),
    reason=f"isolation here is {SANDBOX_MODES[0]!r}: file-system/uid/IPC properties need "
           f"one of {JAIL_MODES}")


def sandbox_uid_processes(uid_low: int, uid_high: int) -> list[int]:
    """Pids on the host whose real uid is in [uid_low, uid_high): sandbox leftovers."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    if uid_low <= int(line.split()[1]) < uid_high:
                        found.append(int(entry))
                    break
    return found
