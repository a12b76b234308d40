"""``mgrpo ui RUN_DIR``: the dashboard of an embedded run on localhost (docs/dashboard.md)."""

from __future__ import annotations

from pathlib import Path

import typer


def ui(run: Path = typer.Argument(..., exists=True, file_okay=False,
                                  help="An embedded run's folder (holds store.db and "
                                  "metrics.csv), e.g. runs/demo/run."),
       host: str = typer.Option("127.0.0.1", help="Interface to bind (read-only, no auth: "
                                "keep it on localhost)."),
       port: int = typer.Option(8765, min=1, max=65535, help="Port.")) -> None:
    """Serve the training dashboard of an embedded run at http://HOST:PORT/ui."""
    # on use: keeps torch, sqlalchemy, kombu out of the CLI's start
    from mgrpo.dashboard.embedded import NotARunDir, serve_ui

    try:
        serve_ui(run, host=host, port=port)
    except NotARunDir as error:
        raise typer.BadParameter(str(error)) from error
