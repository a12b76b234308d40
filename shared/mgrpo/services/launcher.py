"""Run services as local processes: ``python -m mgrpo.cli.main <argv>``, each with its own
health port and output (a log file, or lines prefixed with its name on our stdout).

Used by ``mgrpo up``, ``bench/round.py`` and the integration tests. Not a supervisor: a dead
child is reported, never restarted.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_HANDED_OUT: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port nobody listens on now, below the kernel's ephemeral range: a port the kernel
    hands out itself (bind to 0) can be taken by any outgoing connection (to the broker, the
    database) before the child that was given it binds it. Never the same port twice in one
    process."""
    low = ephemeral_range()[0]
    start, stop = (20000, low) if low > 21000 else (low // 2, low)
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(start, stop)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {start}-{stop - 1}")


def _pump(name: str, stream) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stdout.flush()


class ServiceProcesses:
    """Start, watch and stop service processes. ``log_dir`` None: output goes to our stdout,
    each line prefixed ``[name]``; else to ``{log_dir}/{name}.log``."""

    def __init__(self, env: dict[str, str], log_dir: Path | None = None) -> None:
        self.env, self.log_dir = env, log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    def start(self, name: str, *argv: str, port: int | None = None,
              health_port: int | None = None) -> subprocess.Popen:
        """``argv`` after ``mgrpo``. ``health_port``: MGRPO_HEALTH_PORT of the child (free
        one if None); ``port``: where its /healthz answers when that differs (HTTP apps)."""
        health_port = health_port or free_port()
        env = {**self.env, "MGRPO_HEALTH_PORT": str(health_port)}
        command = [sys.executable, "-m", "mgrpo.cli.main", *argv]
        if self.log_dir is None:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
            threading.Thread(target=_pump, args=(name, proc.stdout), daemon=True).start()
        else:
            log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name], self.ports[name] = proc, port or health_port
        return proc

    def log(self, name: str) -> str:
        if self.log_dir is None:
            return ""
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def wait_healthy(self, *names: str, timeout_s: float = 300.0) -> None:
        """Until every named process (all if none named) answers /healthz with 200."""
        import httpx

        deadline = time.monotonic() + timeout_s
        for name in names or list(self.procs):
            while True:
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n"
                                       f"{self.log(name)[-3000:]}")
                try:
                    url = f"http://127.0.0.1:{self.ports[name]}/healthz"
                    if httpx.get(url, timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not healthy in {timeout_s} s:\n"
                                       f"{self.log(name)[-3000:]}")
                time.sleep(0.2)

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=30)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """SIGTERM everything, then SIGKILL what is still running after ``timeout_s``."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
