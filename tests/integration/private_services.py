"""PRIVATE RabbitMQ and PostgreSQL instances for tests that restart them.

The shared services on 5672/5432 serve every other test (and other people's): a test must never
restart them. These start a second RabbitMQ node (own node name, ports, Mnesia and log dirs,
config without the management plugin, own Erlang cookie in its own HOME) and a throwaway
PostgreSQL cluster (``initdb`` + ``pg_ctl``, as user ``postgres`` when we are root) in temp
dirs on free ports, and remove them afterwards.

What this module does NOT do: skip. A machine without the binaries fails the fixture under
``CI=true`` (``tests/integration/conftest.py`` decides).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from mgrpo.services.launcher import free_port


def _wait_port(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


class PrivateRabbitMQ:
    """A second RabbitMQ node; ``url``, ``stop_app()``, ``start_app()``, ``close()``."""

    def __init__(self) -> None:
        server = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the unwrapped script (no su)
        if not os.path.exists(server):
            server = shutil.which("rabbitmq-server") or ""
        if not server:
            raise RuntimeError("rabbitmq-server is not installed")
        self.bin = Path(server).parent
        self.dir = Path(tempfile.mkdtemp(prefix="mgrpo-rmq-"))
        self.port, dist = free_port(), free_port()
        self.node = f"mgrpotest{uuid.uuid4().hex[:8]}@localhost"
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "env.conf").write_text("")
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir()
        self.env = {**os.environ, "HOME": str(self.dir), "RABBITMQ_NODENAME": self.node,
                    "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(dist),
                    "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                    "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(self.dir / "log"),
                    "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                    "RABBITMQ_CONF_ENV_FILE": str(self.dir / "env.conf"),
                    "RABBITMQ_PID_FILE": str(self.dir / "pid"),
                    "ERL_EPMD_ADDRESS": "127.0.0.1"}
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self._log = open(self.dir / "server.out", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([server], env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if not _wait_port(self.port, 120):
                raise RuntimeError(f"private RabbitMQ did not listen on {self.port} within "
                                   f"120 s:\n{self.log()[-3000:]}")
            self.ctl("await_startup", "--timeout", "60", timeout_s=90)
        except Exception:
            self.close()
            raise

    def ctl(self, *args: str, timeout_s: float = 60) -> str:
        done = subprocess.run([str(self.bin / "rabbitmqctl"), "-n", self.node, *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stderr[-2000:]}\n"
                               f"{self.log()[-2000:]}")
        return done.stdout

    def log(self) -> str:
        return (self.dir / "server.out").read_text(errors="replace")

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.ctl("await_startup", "--timeout", "60", timeout_s=90)
        if not _wait_port(self.port, 60):
            raise RuntimeError(f"private RabbitMQ did not listen on {self.port} again")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # else: kill our own process group below
            self.ctl("shutdown", timeout_s=60)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=10)
        self._log.close()
        _remove(self.dir)


def _remove(folder: Path) -> None:
    """rmtree, again while a stopping server still writes its last files."""
    for _ in range(5):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(1)


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise RuntimeError("PostgreSQL server binaries (pg_ctl, initdb) are not installed")
    return Path(pg_ctl).parent


class PrivatePostgres:
    """A throwaway PostgreSQL cluster; ``url`` (database ``postgres``), ``stop()``,
    ``start()``, ``restart()``, ``close()``."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="mgrpo-pg-"))
        self.port = free_port()
        self.data = self.dir / "data"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        try:
            self.start()
        except Exception:
            self.close()
            raise

    def _run(self, tool: str, *args: str, timeout_s: float = 120) -> None:
        done = subprocess.run([*self._as, str(self.bin / tool), *args], capture_output=True,
                              text=True, timeout=timeout_s, cwd=self.dir)
        if done.returncode != 0:
            log = (self.dir / "log").read_text(errors="replace") \
                if (self.dir / "log").exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {done.stderr[-2000:]}\n"
                               f"{log[-2000:]}")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already stopped
            self.stop()
        _remove(self.dir)
