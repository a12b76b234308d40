"""`mgrpo serve <service>`: start one service of the distributed system in this process.

Each command is a thin shell: it reads settings and hands over to the library's entry point
(``mgrpo.services.entrypoints``; the sandbox: ``mgrpo.sandbox.app``), the same one the
container shells in ``services/`` call.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("sandbox")
def sandbox(host: str = typer.Option("127.0.0.1", help="Interface to bind (no auth: keep "
                                     "it private)."),
            port: int = typer.Option(8090, help="TCP port."),
            max_concurrency: int = typer.Option(None, help="Calls at once (default "
                                                "MGRPO_SANDBOX_MAX_CONCURRENCY or 8)."),
            max_queue: int = typer.Option(None, help="Calls waiting before 429 (default "
                                          "MGRPO_SANDBOX_MAX_QUEUE or 256).")) -> None:
    """Run the tool sandbox service (POST /v1/execute, /healthz, /metrics)."""
    # on use: keeps fastapi out of the CLI's start
    import uvicorn

    from mgrpo.sandbox.app import create_app
    from mgrpo.sandbox.service import SandboxServiceSettings
    from mgrpo.web.server import server_options

    overrides = {k: v for k, v in {"max_concurrency": max_concurrency,
                                   "max_queue": max_queue}.items() if v is not None}
    # on use: keeps the library out of the CLI's start
    from mgrpo.logs import setup_logging

    setup_logging("sandbox", _settings().log_level)
    uvicorn.run(create_app(SandboxServiceSettings(**overrides)), **server_options(
        host=host, port=port, log_level="warning", log_config=None))
    _exit_now()


def _exit_now() -> None:
    # on use: keeps the library out of the CLI's start
    from mgrpo.services.process import exit_now

    exit_now()  # skip the slow interpreter teardown once the service has stopped


def _settings():
    # on use: keeps the library out of the CLI's start
    from mgrpo.config import get_settings

    return get_settings()


@app.command("planner")
def planner(host: str = typer.Option("127.0.0.1", help="Interface to bind (0.0.0.0 in a "
                                     "container)."),
            port: int = typer.Option(8000, help="TCP port of the REST API.")) -> None:
    """Run the planner REST API (/v1/queries, /v1/rounds, ..., /healthz, /readyz, /metrics;
    OpenAPI at /docs)."""
    # on use: keeps torch, sqlalchemy, celery out of the CLI's start
    from mgrpo.services.entrypoints import serve_api

    serve_api(_settings(), host, port)
    _exit_now()


@app.command("planner-worker")
def planner_worker(batch_size: int = typer.Option(64, min=1, help="Episode tasks played as "
                                                  "one batched run.")) -> None:
    """Run a planner worker: episodes from planner.episodes, delegations over the bus."""
    # on use: keeps torch, sqlalchemy, celery out of the CLI's start
    from mgrpo.services.entrypoints import serve_planner_worker

    serve_planner_worker(_settings(), batch_size)
    _exit_now()


@app.command("subagent")
def subagent(name: str = typer.Option(..., help="Sub-agent role, e.g. searcher (its queue is "
                                      "subagent.<name>)."),
             tool: str = typer.Option("", help="Tool registry name: search, python, ... "
                                      "(required, except for a turn team's role and a "
                                      "sub-agent that delegates)."),
             model: str = typer.Option(None, help="Model folder (default: the run config's "
                                       "path for this role's model)."),
             description: str = typer.Option("", help="One line the planner sees."),
             batch_size: int = typer.Option(64, min=1)) -> None:
    """Run one sub-agent; it registers itself, so its caller lists it. One whose role
    delegates (``calls:`` in ``agents``) sends its own calls to its callees' workers. With a
    turn_team run config: the worker of role NAME (samples its turns)."""
    # on use: keeps torch, sqlalchemy, celery out of the CLI's start
    from mgrpo.services.entrypoints import serve_subagent

    serve_subagent(_settings(), name, tool, model, description, batch_size)
    _exit_now()


@app.command("trainer")
def trainer(model: str = typer.Option(..., help="The model this trainer trains (a key of "
                                      "`models:` in the run config).")) -> None:
    """Run one model's trainer: ingest, wait for the round, train, checkpoint, announce.
    With MGRPO_TRAINER_NPROC > 1 (outside torchrun): as a torchrun job of that many ranks."""
    # on use: keeps torch, sqlalchemy, celery out of the CLI's start
    import os

    from mgrpo.parallel.ranks import torchrun_argv
    from mgrpo.services.entrypoints import serve_trainer

    settings = _settings()
    if settings.trainer_nproc > 1 and "WORLD_SIZE" not in os.environ:
        argv = torchrun_argv(settings.trainer_nproc, model)
        os.execv(argv[0], argv)  # torchrun becomes this process: signals reach it
    serve_trainer(settings, model)
    _exit_now()


@app.command("control")
def control() -> None:
    """Run the control-plane Celery worker: checkpoint pruning, dead-letter replays and round
    commands from <MGRPO_QUEUE_PREFIX>mgrpo.control, one task at a time."""
    # on use: keeps torch, sqlalchemy, celery out of the CLI's start
    from mgrpo.services.entrypoints import serve_control

    serve_control(_settings())
    _exit_now()
