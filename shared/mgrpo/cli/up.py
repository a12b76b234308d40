"""``mgrpo up --config FILE``: every service as a local process against the local RabbitMQ and
PostgreSQL (SPEC 2.4): migrations, the planner API, a planner worker, one sub-agent per
sub-agent role of the run config, one trainer per trainable model. Each child's output is
prefixed with its name; Ctrl-C (or SIGTERM) stops them all.

What it does NOT do: start RabbitMQ or PostgreSQL, or restart a child that dies (it stops
everything instead, so a broken set-up is visible at once).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer

from mgrpo.services.launcher import ServiceProcesses

BASE_HEALTH_PORT = 9100


def service_commands(config_path: str, api_port: int) -> list[tuple[str, list[str]]]:
    """(name, argv after ``mgrpo``) of every service the run config needs."""
    from mgrpo.tools import ROLE_TOOLS
    from mgrpo.training.config import load_run_config

    cfg = load_run_config(config_path)
    out = [("planner", ["serve", "planner", "--host", "127.0.0.1", "--port", str(api_port)]),
           ("planner-worker", ["serve", "planner-worker"])]
    for role, model in cfg.agents.items():
        if role != "planner":
            tool = cfg.role_tools.get(role) or ROLE_TOOLS.get(role, role)
            out.append((f"subagent-{role}", ["serve", "subagent", "--name", role, "--tool",
                                             tool, "--model", cfg.models[model].path]))
    out += [(f"trainer-{m}", ["serve", "trainer", "--model", m]) for m in cfg.trained_models()]
    return out


def up(config: Path = typer.Option(..., exists=True, dir_okay=False,
                                   help="YAML run config shared by every service."),
       api_port: int = typer.Option(8000, help="Port of the planner REST API.")) -> None:
    """Start every service as a local process (RabbitMQ and PostgreSQL must be running)."""
    env = {**os.environ, "MGRPO_MODE": "distributed",
           "MGRPO_RUN_CONFIG": str(config.resolve())}
    subprocess.run([sys.executable, "-m", "mgrpo.cli.main", "db", "upgrade"], env=env,
                   check=True)
    services = ServiceProcesses(env)  # output prefixed [name] on our stdout
    for i, (name, argv) in enumerate(service_commands(str(config), api_port)):
        proc = services.start(name, *argv, health_port=BASE_HEALTH_PORT + i)
        typer.echo(f"[up] started {name} (pid {proc.pid}, health :{BASE_HEALTH_PORT + i})")
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    while not stopping.is_set():
        dead = services.dead()
        if dead:
            code = services.procs[dead[0]].returncode
            typer.echo(f"[up] {dead[0]} exited with {code}; stopping all")
            break
        time.sleep(0.5)
    services.stop_all()
    typer.echo("[up] all services stopped")
