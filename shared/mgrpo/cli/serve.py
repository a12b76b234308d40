"""`mgrpo serve <service>`: start one service of the distributed system in this process.

Each command is a thin shell: it reads settings and hands over to ``services/<name>/main.py``.
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
    import uvicorn

    from mgrpo.sandbox.service import SandboxServiceSettings
    from services.sandbox.app import create_app

    overrides = {k: v for k, v in {"max_concurrency": max_concurrency,
                                   "max_queue": max_queue}.items() if v is not None}
    uvicorn.run(create_app(SandboxServiceSettings(**overrides)), host=host, port=port,
                log_level="warning")
