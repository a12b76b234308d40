"""Run model-written Python in a fresh, limited, isolated process: :class:`LocalSandbox`.

One call = one ``unshare`` + one interpreter (see :mod:`mgrpo.sandbox.isolation` for what
each isolation mode covers and :mod:`mgrpo.sandbox._launcher` for the jail itself). This
module enforces what only the host can: the wall clock, the output cap (pipes are read
incrementally and the call is stopped at the cap), killing the whole process group, and the
translation of what happened into an :class:`ExecResult` status.

It does NOT limit total CPU across concurrent calls (the service's concurrency limit does),
does not persist anything between calls, and is not a defence against kernel exploits.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Literal

from pydantic import Field

from mgrpo.sandbox.isolation import (
    JAIL_DEVICES,
    JAIL_MODES,
    JAIL_WORK_DIR,
    VISIBLE_TOP_LEVEL,
    IsolationMode,
    detect_isolation,
    interpreter_dirs_to_keep,
    launcher_command,
)
from mgrpo.sandbox.types import ExecRequest, ExecResult
from mgrpo.validation import StrictModel

_CHUNK = 65536
_LAUNCHER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class SandboxLimits(StrictModel):
    """Per-call limits beyond those in :class:`ExecRequest` (timeout, memory)."""

    output_limit_bytes: int = Field(
        1_000_000, ge=1, description="stdout + stderr bytes kept; more -> status output_limit "
        "and the call is stopped (a model printing in a loop must not fill the host's RAM).")
    max_memory_mb: int = Field(
        1024, ge=16, le=8192, description="Largest memory_mb a call may ask for; more is "
        "refused (LimitExceeded, HTTP 422): max_concurrent calls x this must fit the host.")
    max_processes: int = Field(
        16, ge=1, description="RLIMIT_NPROC of the call's own uid: stops fork bombs. Binds "
        "only in isolation 'root' (own uid per call) or when the service is not root.")
    file_size_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file it may write.")
    work_dir_mb: int = Field(64, ge=1, description="Size of the private tmpfs work dir "
                             "(isolation 'root'); elsewhere a host temp dir, no size cap.")
    isolation: Literal["auto", "bwrap", "root", "userns", "none"] = Field(
        "auto", description="auto: the strongest mode the host allows (detect_isolation).")
    uid_base: int = Field(
        200_000_000, ge=65_536, le=4_000_000_000, description="Calls run as uids "
        "uid_base + 128*(pid % 10000) + slot: unique per concurrent call, no passwd entry.")
    max_concurrent: int = Field(128, ge=1, le=128, description="Calls in flight at once "
                                "(uid slots); more wait.")


class LimitExceeded(ValueError):
    """The request asks for more than this sandbox allows; the message names the limit."""


class _UidPool:
    """Hands each concurrent call its own uid, so RLIMIT_NPROC counts only that call."""

    def __init__(self, base: int, size: int):
        self._free = list(range(base, base + size))
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def lease(self) -> Iterator[int]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._free))
            uid = self._free.pop()
        try:
            yield uid
        finally:
            with self._cond:
                self._free.append(uid)
                self._cond.notify()


class LocalSandbox:
    """Execute :class:`ExecRequest` s in-process-host, one isolated child per call.

    Thread-safe: the service calls :meth:`execute` from many threads at once.
    """

    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self.mode: IsolationMode = (detect_isolation() if self.limits.isolation == "auto"
                                    else self.limits.isolation)
        base = self.limits.uid_base + 128 * (os.getpid() % 10_000)
        self._uids = _UidPool(base, self.limits.max_concurrent)

    def execute(self, request: ExecRequest) -> ExecResult:
        """Run ``request.code``; never raises for anything the code does.

        Raises :class:`LimitExceeded` before running anything when the request asks for more
        memory than ``limits.max_memory_mb``.
        """
        if request.memory_mb > self.limits.max_memory_mb:
            raise LimitExceeded(
                f"memory_mb={request.memory_mb} is above this sandbox's limit "
                f"max_memory_mb={self.limits.max_memory_mb} (MGRPO_SANDBOX_MAX_MEMORY_MB); "
                "ask for less")
        start = time.monotonic()
        with self._uids.lease() as uid, self._work_dir() as work_dir:
            argv = launcher_command(self.mode, json.dumps(self._config(request, uid, work_dir)),
                                    work_dir, self.limits.work_dir_mb)
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    env=_LAUNCHER_ENV, cwd="/", close_fds=True)
            try:
                stdout, stderr, stopped = _pump(
                    proc, request.code.encode("utf-8", "surrogatepass"),
                    deadline=start + request.timeout_s, cap=self.limits.output_limit_bytes)
            finally:
                _kill_group(proc)
        return _classify(proc.returncode, stdout, stderr, stopped, time.monotonic() - start)

    def _config(self, request: ExecRequest, uid: int, work_dir: str) -> dict:
        setuid = self.mode == "root" or (self.mode == "bwrap" and os.geteuid() == 0)
        return {"mode": self.mode, "uid": uid, "workdir": work_dir, "setuid": setuid,
                "devices": list(JAIL_DEVICES),
                "mem_bytes": request.memory_mb * 2**20,
                "cpu_s": max(1, math.ceil(request.timeout_s)),
                "nproc": self.limits.max_processes,
                "fsize_bytes": self.limits.file_size_mb * 2**20,
                "work_mb": self.limits.work_dir_mb,
                "visible": list(VISIBLE_TOP_LEVEL), "keep": interpreter_dirs_to_keep(),
                "env": {"PATH": _LAUNCHER_ENV["PATH"], "HOME": work_dir, "TMPDIR": work_dir,
                        "LANG": "C.UTF-8"}}

    @contextlib.contextmanager
    def _work_dir(self) -> Iterator[str]:
        if self.mode in JAIL_MODES:  # a tmpfs inside the mount namespace: gone with it
            yield JAIL_WORK_DIR
            return
        path = tempfile.mkdtemp(prefix="mgrpo-sandbox-")
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _pump(proc: subprocess.Popen, code: bytes, deadline: float,
          cap: int) -> tuple[bytes, bytes, str | None]:
    """Feed the code to stdin and read both pipes until EOF, the deadline or the cap.

    Returns (stdout, stderr, stopped) with stopped in {None, "timeout", "output_limit"}.
    """
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in out:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd, sent = proc.stdin.fileno(), 0
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    stopped = None
    try:
        while len(sel.get_map()) > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stopped = "timeout"
                break
            for key, _ in sel.select(timeout=remaining):
                if key.fd == stdin_fd:
                    sent = _write_some(sel, proc, code, sent)
                    continue
                chunk = _read_some(key.fd)
                if chunk == b"":
                    sel.unregister(key.fd)
                elif chunk:
                    out[key.fd] += chunk
            if sum(len(b) for b in out.values()) > cap:
                stopped = "output_limit"
                break
        if stopped is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.returncode is None:
                stopped = "timeout"
    finally:
        sel.close()
    return bytes(out[proc.stdout.fileno()]), bytes(out[proc.stderr.fileno()]), stopped


def _write_some(sel: selectors.BaseSelector, proc: subprocess.Popen, code: bytes,
                sent: int) -> int:
    try:
        sent += os.write(proc.stdin.fileno(), code[sent:sent + _CHUNK])
    except (BrokenPipeError, BlockingIOError):
        sent = len(code)  # the launcher died early: its exit status tells why
    if sent >= len(code):
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return sent


def _read_some(fd: int) -> bytes | None:
    """A chunk, b"" at EOF, or None when a spurious wake-up left nothing to read."""
    try:
        return os.read(fd, _CHUNK)
    except BlockingIOError:
        return None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the call's process group; the PID namespace (if any) takes the rest with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()


def _classify(returncode: int | None, stdout: bytes, stderr: bytes, stopped: str | None,
              duration_s: float) -> ExecResult:
    """Map what happened to a status. Signal N (launcher exit 128+N) is reported as -N."""
    code = returncode
    if code is not None and 128 < code < 160:
        code = -(code - 128)
    err_text = stderr.decode("utf-8", "replace")
    if stopped is not None:
        status, code = stopped, None
    elif code == -signal.SIGXCPU:
        status = "timeout"
    elif code != 0 and ("MemoryError" in err_text[-4000:]
                        or "Cannot allocate memory" in err_text[-4000:]):
        status = "memory"
    else:
        status = "ok" if code == 0 else "error"
    return ExecResult(status=status, stdout=stdout.decode("utf-8", "replace"), stderr=err_text,
                      exit_code=code, duration_s=round(duration_s, 4))
