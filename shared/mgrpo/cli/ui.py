"""``mgrpo ui RUN_DIR``: the dashboard of an embedded run on localhost (docs/dashboard.md).

:func:`ui_app` composes the planner API's app over the run folder the dashboard opens
(:func:`mgrpo.dashboard.embedded.open_run_dir`), with no bus: every page and read endpoint
works, starting a round does not (the page hides the button). Mutating endpoints need a
random token generated per process and never shown, so the server is read-only.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import typer


def ui_app(run_dir: Path):
    """The FastAPI app serving ``/ui`` for the embedded run in ``run_dir``."""
    # on use: keeps sqlalchemy, fastapi out of the CLI's start
    from mgrpo.config import Settings
    from mgrpo.dashboard.embedded import open_run_dir
    from mgrpo.services.api.app import create_app
    from mgrpo.services.api.deps import ApiState

    run = open_run_dir(run_dir)
    settings = Settings(mode="embedded", database_url=run.database_url,
                        api_token=secrets.token_hex(16))
    return create_app(ApiState(settings, run.cfg, run.store, bus=None, run_dir=run.run_dir))


def ui(run: Path = typer.Argument(..., exists=True, file_okay=False,
                                  help="An embedded run's folder (holds store.db and "
                                  "metrics.csv), e.g. runs/demo/run."),
       host: str = typer.Option("127.0.0.1", help="Interface to bind (read-only, no auth: "
                                "keep it on localhost)."),
       port: int = typer.Option(8765, min=1, max=65535, help="Port.")) -> None:
    """Serve the training dashboard of an embedded run at http://HOST:PORT/ui."""
    # on use: keeps torch, sqlalchemy, kombu, uvicorn out of the CLI's start
    import uvicorn

    from mgrpo.dashboard.embedded import NotARunDir
    from mgrpo.web.server import server_options

    try:
        app = ui_app(run)
    except NotARunDir as error:
        raise typer.BadParameter(str(error)) from error
    print(f"dashboard: http://{host}:{port}/ui  (run {run}; Ctrl-C to stop)", flush=True)
    uvicorn.run(app, **server_options(host=host, port=port, log_level="warning"))
