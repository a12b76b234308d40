"""Helpers for the sandbox tests (a plain module: conftest files are not importable)."""

from __future__ import annotations

import contextlib
import os

import pytest

from mgrpo.sandbox.isolation import JAIL_MODES, detect_isolation, mode_works

# The hostile suite runs once per jail mode this host has ("bwrap", "root"); with neither,
# once in the detected weaker mode, where the tests that need a jail are skipped.
SANDBOX_MODES = [m for m in JAIL_MODES if mode_works(m)] or [detect_isolation()]
needs_jail = pytest.mark.skipif(
    not any(m in JAIL_MODES for m in SANDBOX_MODES),
    reason=f"isolation here is {detect_isolation()!r}: file-system/uid/IPC properties need "
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
