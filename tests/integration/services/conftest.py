"""Fixtures: a fresh PostgreSQL database, unique queue names, tiny models and a benchmark, and
a launcher that runs each service as its own process (``python -m mgrpo.cli.main serve ...``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mgrpo.store import Store
from mgrpo.store.admin import temporary_database

KIT_DIR = Path(__file__).resolve().parents[2] / "unit" / "services"
sys.path.insert(0, str(KIT_DIR))

from services_testkit import make_bench, make_tiny, write_run_config  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Services:
    """Start/stop/kill service processes with their own log files."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    def start(self, name: str, *argv: str, port: int | None = None) -> subprocess.Popen:
        """``port``: where /healthz answers when it is not MGRPO_HEALTH_PORT (HTTP apps)."""
        port = port or free_port()
        env = {**self.env, "MGRPO_HEALTH_PORT": str(port)}
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        proc = subprocess.Popen([sys.executable, "-m", "mgrpo.cli.main", "serve", *argv],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name], self.ports[name] = proc, port
        return proc

    def wait_healthy(self, name: str, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited with {self.procs[name].returncode}:\n"
                                     f"{self.log(name)[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.ports[name]}/healthz",
                             timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{name} not healthy in {timeout_s} s:\n{self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    return make_tiny(root / "tiny"), make_bench(root / "bench")


@pytest.fixture
def deployment(postgres_url, rabbitmq_url, unique_name, assets, tmp_path):
    """(env, store, Services): a fresh database and queue prefix for ONE test."""
    tiny, bench = assets
    cfg_path = write_run_config(tmp_path / "run.yaml", tiny, bench, name=unique_name, k=2,
                                queries=3)
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        env = {**os.environ, "MGRPO_MODE": "distributed", "MGRPO_DATABASE_URL": url,
               "MGRPO_BROKER_URL": rabbitmq_url, "MGRPO_RUN_CONFIG": str(cfg_path),
               "MGRPO_ENGINE": "services_testkit:scripted_engine",
               "MGRPO_QUEUE_PREFIX": f"{unique_name}.",
               "MGRPO_CHECKPOINT_URI": str(tmp_path / "ckpt"), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(KIT_DIR), os.environ.get("PYTHONPATH", "")]),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        services = Services(env, tmp_path)
        try:
            yield env, store, services
        finally:
            services.stop_all()
            _delete_queues(rabbitmq_url, unique_name)
            store.close()


def _delete_queues(broker_url: str, prefix: str) -> None:
    from kombu import Connection

    names = ["planner.episodes", "trainer.planner", "trainer.searcher", "trainer.coder",
             "subagent.searcher", "subagent.coder", "mgrpo.dead_letter"]
    with Connection(broker_url) as connection:
        channel = connection.channel()
        for name in names:
            try:
                channel.queue_delete(f"{prefix}.{name}")
            except Exception:  # already gone (or never declared): nothing to clean
                channel = connection.channel()
