"""Ownership of an embedded run's folder: a lock file naming the process that trains in it,
and a start that fails before its first round leaves the folder as it found it.

``<out_dir>/mgrpo.lock`` holds the owner's pid, host and start time while a run trains
there. A second process is refused while that owner lives: a ``--resume`` would append a
second copy of the live run's rounds to ``metrics.csv``, an ``--overwrite`` would delete it.
A lock left by a process that died (same host, pid gone) is stale and taken over. A lock from
another host cannot be checked from here, so it counts as live; the error names the file to
delete once that run is known to be gone.

What this module does NOT do: lock a distributed run (its services coordinate through the
stats store and the trainer lease) or protect against a second process that ignores the
lock.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "mgrpo.lock"
STATE_FILE = "state.json"  # mgrpo.training.run_state's commit point (written per round)
# Files a run only appends to, so cutting them back to their old size undoes a failed start.
# Others (store.db) are rewritten in place and left as they are.
APPEND_ONLY = ("metrics.csv",)


class RunFolderInUse(RuntimeError):
    """Another live process trains in the folder: ``str()`` says who, ``hint`` what to do."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    try:  # Linux: a killed child its parent has not reaped yet is a zombie, not a run
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def live_owner(out_dir: Path) -> dict | None:
    """The lock's owner (pid, host, started) if that process may still run, else None (no
    lock, an unreadable one, or one whose process on this host is gone)."""
    try:
        owner = json.loads((out_dir / LOCK_FILE).read_text())
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host == socket.gethostname() and (pid == os.getpid() or not _alive(pid)):
        return None
    return owner


def refuse_if_in_use(out_dir: Path, action: str) -> None:
    """Raise :class:`RunFolderInUse` if a live process owns ``out_dir``."""
    owner = live_owner(out_dir)
    if owner is None:
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
    raise RunFolderInUse(
        f"{out_dir} is in use by a live run (pid {owner['pid']} on {owner['host']}, since "
        f"{since}); {action} would corrupt it",
        "wait for it to end or stop it; if that process is known to be gone (another "
        f"host), delete {out_dir / LOCK_FILE}")


def _acquire(out_dir: Path) -> None:
    refuse_if_in_use(out_dir, "training in it")
    lock = out_dir / LOCK_FILE
    lock.unlink(missing_ok=True)  # stale (its process is gone) or absent
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process took it between the check and here
        refuse_if_in_use(out_dir, "training in it")
        raise
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                   "started": time.time()}, fh)


def _release(out_dir: Path) -> None:
    lock = out_dir / LOCK_FILE
    try:
        owner = json.loads(lock.read_text())
    except (OSError, ValueError):
        return
    if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
        lock.unlink(missing_ok=True)


def _snapshot(out_dir: Path) -> dict[Path, int]:
    """Every path under ``out_dir`` with its size (folders: -1)."""
    return {p: (-1 if p.is_dir() else p.stat().st_size) for p in out_dir.rglob("*")}


def _restore(out_dir: Path, existed: bool, before: dict[Path, int]) -> None:
    """Remove what a failed start added; cut the append-only files back."""
    if not existed:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    for path in sorted(out_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.name == LOCK_FILE and path.parent == out_dir:
            continue
        if path not in before:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        elif path.name in APPEND_ONLY and path.stat().st_size > before[path] >= 0:
            with path.open("r+b") as fh:
                fh.truncate(before[path])


@contextmanager
def own_run_folder(out_dir: Path) -> Iterator[None]:
    """Train in ``out_dir`` as its owner: refuse a folder a live process owns, hold the
    lock for the block, and, if the block fails before a round was committed (the state
    file unchanged), put the folder back as it was (absent if it was)."""
    existed = out_dir.exists()
    if existed:
        refuse_if_in_use(out_dir, "training in it")
    before = _snapshot(out_dir) if existed else {}
    state = out_dir / STATE_FILE
    state_before = state.read_bytes() if state.exists() else None
    out_dir.mkdir(parents=True, exist_ok=True)
    _acquire(out_dir)
    try:
        yield
    except BaseException:
        if (state.read_bytes() if state.exists() else None) == state_before:
            _restore(out_dir, existed, before)
        raise
    finally:
        _release(out_dir)
