"""Helpers for the sandbox tests (a plain module: conftest files are not importable)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from mgrpo.sandbox.isolation import JAIL_MODES, detect_isolation, mode_works

# The hostile suite runs once per jail mode this host has ("bwrap", "root"); with neither,
# once in the detected weaker mode, where the tests that need a jail are skipped.
SANDBOX_MODES = [m for m in JAIL_MODES if mode_works(m)] or [detect_isolation()]
needs_jail = pytest.mark.skipif(
    not any(m in JAIL_MODES for m in SANDBOX_MODES),
    reason=f"isolation here is {detect_isolation()!r}: file-system/uid/IPC properties need "
           f"one of {JAIL_MODES}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(app) -> Iterator[str]:
    """Serve `app` with a real uvicorn on a free port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


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
