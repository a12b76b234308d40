"""``mgrpo up --config FILE``: every service as a local process against the local RabbitMQ and
PostgreSQL (docs/services.md, the table of commands): migrations, the planner API, a planner
worker, one sub-agent per
sub-agent role of the run config at every level of a nested hierarchy (none for
``algorithm: grpo``: the planner worker plays every role), one trainer per model an agent
plays (a frozen model's scores, never updates).
Each child's output is
prefixed with its name; Ctrl-C (or SIGTERM) stops them all.

Before starting anything it checks what would otherwise fail minutes later inside a child:
the run config (strict, see docs/configuration.md), every model folder a service loads, and
the ports. A child that exits on its own stops everything and ``up`` exits non-zero (the
child's code, or 1), so scripts and CI see a broken set-up.

What it does NOT do: start RabbitMQ or PostgreSQL, or restart a child that dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer

from mgrpo.cli.errors import UserError
from mgrpo.services.launcher import ServiceProcesses

BASE_HEALTH_PORT = 9100
STOP_TIMEOUT_S = 10.0  # each service stops in order in < 1 s; then SIGKILL the stragglers


def service_commands(config_path: str, api_port: int) -> list[tuple[str, list[str]]]:
    """(name, argv after ``mgrpo``) of every service the run config needs."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.tools import ROLE_TOOLS
    from mgrpo.training.config_files import load_run_config
    from mgrpo.workflows import TurnTeam, refuse_outside_services

    cfg = load_run_config(config_path)
    refuse_outside_services(cfg, "mgrpo up")
    out = [("planner", ["serve", "planner", "--host", "127.0.0.1", "--port", str(api_port)]),
           ("planner-worker", ["serve", "planner-worker"])]  # a turn team: its coordinator
    team = isinstance(cfg.flow, TurnTeam)
    agent_roles = cfg.algo.agent_roles(cfg.agents)  # none inline: the planner plays them
    for role, model in cfg.agents.items():
        if team:  # each role's worker samples its turns (no tool: the coordinator acts)
            out.append((f"subagent-{role}", ["serve", "subagent", "--name", role, "--model",
                                             cfg.models[model].path]))
        elif role in agent_roles:
            # a sub-agent that delegates (nested) has no tool unless role_tools names one
            tool = cfg.role_tools.get(role) or ("" if cfg.delegation.get(role)
                                                else ROLE_TOOLS.get(role, role))
            out.append((f"subagent-{role}", ["serve", "subagent", "--name", role,
                                             *(["--tool", tool] if tool else []),
                                             "--model", cfg.models[model].path]))
    # every model an agent plays: a frozen model's trainer scores its trajectories (no update)
    out += [(f"trainer-{m}", ["serve", "trainer", "--model", m])
            for m in dict.fromkeys(cfg.agents.values())]
    return out


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def preflight(config_path: str, api_port: int, engine: str = "torch") -> None:
    """Raise :class:`UserError` naming every problem found before any process starts."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.training.config_files import load_run_config
    from mgrpo.workflows import refuse_outside_services

    cfg = load_run_config(config_path)  # a typo fails here, in one line
    refuse_outside_services(cfg, "mgrpo up")
    problems = []
    if engine == "torch":  # a custom engine may take a URL or a hub id instead of a folder
        for name in dict.fromkeys(cfg.agents.values()):
            folder = Path(cfg.models[name].path)
            if not (folder / "config.json").is_file():
                what = "does not exist" if not folder.exists() else "has no config.json"
                problems.append(f"model {name!r}: folder {str(folder)!r} {what}")
    if cfg.flow.reads_bench and not Path(cfg.bench_dir).is_dir():
        problems.append(f"bench_dir {cfg.bench_dir!r} does not exist")
    ports = [api_port] + [BASE_HEALTH_PORT + i for i in range(len(service_commands(
        config_path, api_port)))]
    problems += [f"port {p} is already in use" for p in ports if _port_taken(p)]
    if problems:
        raise UserError("; ".join(problems),
                        "paths in the run config are relative to the current folder; "
                        "`mgrpo models init-tiny` and `mgrpo data build` make the folders")


def supervise(services: ServiceProcesses, stopping: threading.Event,
              poll_s: float = 0.5) -> int:
    """Wait until a stop signal (exit code 0) or a child exits on its own (its code, or 1
    if it exited 0: a service never ends by itself); then stop every child."""
    code = 0
    while not stopping.is_set():
        dead = services.dead()
        if dead:
            code = services.procs[dead[0]].returncode or 1
            typer.echo(f"[up] {dead[0]} exited with {services.procs[dead[0]].returncode}; "
                       "stopping all", err=True)
            break
        stopping.wait(poll_s)
    started = time.monotonic()
    services.stop_all(timeout_s=STOP_TIMEOUT_S)
    typer.echo(f"[up] all services stopped in {time.monotonic() - started:.1f} s")
    return code


def up(config: Path = typer.Option(..., exists=True, dir_okay=False,
                                   help="YAML run config shared by every service."),
       api_port: int = typer.Option(8000, help="Port of the planner REST API.")) -> None:
    """Start every service as a local process (RabbitMQ and PostgreSQL must be running).
    Exits non-zero when a service dies."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.config import get_settings

    preflight(str(config), api_port, engine=get_settings().engine)
    env = {**os.environ, "MGRPO_MODE": "distributed",
           "MGRPO_RUN_CONFIG": str(config.resolve())}
    migrated = subprocess.run([sys.executable, "-m", "mgrpo.cli.main", "db", "upgrade"],
                              env=env, check=False)
    if migrated.returncode:
        raise UserError("database migrations failed (output above)",
                        "is PostgreSQL running at MGRPO_DATABASE_URL?")
    services = ServiceProcesses(env)  # output prefixed [name] on our stdout
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    for i, (name, argv) in enumerate(service_commands(str(config), api_port)):
        proc = services.start(name, *argv, health_port=BASE_HEALTH_PORT + i)
        typer.echo(f"[up] started {name} (pid {proc.pid}, health :{BASE_HEALTH_PORT + i})")
    code = supervise(services, stopping)
    if code:
        raise typer.Exit(code)
