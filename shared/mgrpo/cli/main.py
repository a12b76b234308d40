"""Entry point of the ``mgrpo`` console script.

Command groups are registered here and implemented in sibling modules; heavy imports (torch,
transformers, celery) happen inside commands so ``mgrpo --help`` stays fast.
"""

from __future__ import annotations

import os

import typer

from mgrpo import __version__
from mgrpo.cli import (
    config_check,
    control,
    data,
    db,
    dlq,
    models,
    run,
    serve,
    sft,
    ui,
    up,
    worlds,
)
from mgrpo.cli.errors import ErrorReportingGroup

app = typer.Typer(
    help="mgrpo: train a planner and its tool sub-agents (one LLM each) with M-GRPO.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=ErrorReportingGroup,
)


@app.callback()
def _root(debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback of an error (or MGRPO_DEBUG=1).")
          ) -> None:
    if debug:  # the environment, so services started by `mgrpo up` inherit it
        os.environ["MGRPO_DEBUG"] = "1"
    # A user's modules (MGRPO_PLUGINS) before any command builds anything: every command and
    # service (the containers run `mgrpo serve ...`) registers their tools and verifiers.
    from mgrpo.plugins import import_env_plugins

    import_env_plugins()
app.add_typer(models.app, name="models", help="Build and inspect models.")
app.add_typer(data.app, name="data", help="Build the benchmark and demonstrations.")
app.add_typer(serve.app, name="serve",
              help="Run one service (planner, subagent, trainer, control, sandbox).")
app.add_typer(db.app, name="db", help="Stats-store migrations.")
app.add_typer(config_check.app, name="config",
              help="Check a config file (its kind, its options, its paths).")
app.add_typer(dlq.app, name="dlq", help="List and replay the dead-letter queue.")
app.add_typer(control.app, name="control",
              help="Send a control-plane task (prune, replay, start or cancel a round) to "
                   "the control worker.")
app.add_typer(worlds.app, name="worlds",
              help="List the turn-based worlds; measure their scripted experts.")
run.register(app)  # sft, train, eval, ablate, plot, demo, up
app.command("sft")(sft.sft)
app.command("up")(up.up)
app.command("ui")(ui.ui)


@app.command()
def version() -> None:
    """Print the installed mgrpo version."""
    typer.echo(__version__)


if __name__ == "__main__":  # pragma: no cover
    app()
