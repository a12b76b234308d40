"""`mgrpo control ...`: send one control-plane task to the control worker (`mgrpo serve
control`) of a distributed deployment, through the broker.

Each command checks its payload (the task's pydantic model, ``mgrpo.bus.control``), sends it
to ``<MGRPO_QUEUE_PREFIX>mgrpo.control`` and prints one JSON line: the task, its id and the
queue. The effect is read where it lands (the store, the checkpoint folders, the queues);
a task that fails is in the dead-letter queue with its reason (``mgrpo dlq list``).

What this does NOT do: run the task here, or wait for it.
"""

from __future__ import annotations

import json

import typer

app = typer.Typer(no_args_is_help=True)

BROKER_OPTION = typer.Option(None, "--broker", help="AMQP URL; default: MGRPO_BROKER_URL.")


def _send(task: str, payload, broker: str | None) -> None:
    # on use: keeps celery, kombu out of the CLI's start
    from mgrpo.bus.app import control_app, send_control
    from mgrpo.config import get_settings

    settings = get_settings()
    if broker:
        settings = settings.model_copy(update={"broker_url": broker})
    app_ = control_app(settings)
    task_id = send_control(app_, task, payload)
    typer.echo(json.dumps({"task": task, "id": task_id,
                           "queue": app_.conf.mgrpo_control_queue}))


@app.command()
def prune(run_id: str = typer.Option(..., "--run-id", help="The run whose checkpoints go."),
          model: str = typer.Option(..., "--model", help="The model (a key of `models:`)."),
          keep: int = typer.Option(..., "--keep", min=1, help="Newest versions kept."),
          broker: str | None = BROKER_OPTION) -> None:
    """Delete a model's checkpoints of a run but the newest KEEP (records, then folders)."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.bus.control import TASK_PRUNE_CHECKPOINTS, PruneCheckpoints

    _send(TASK_PRUNE_CHECKPOINTS, PruneCheckpoints(run_id=run_id, model=model, keep=keep),
          broker)


@app.command()
def replay(limit: int = typer.Option(1000, "--limit", min=1, help="At most this many."),
           queue: str | None = typer.Option(None, "--queue", help="Only letters from this "
                                            "source queue (full name)."),
           broker: str | None = BROKER_OPTION) -> None:
    """Have the control worker replay the dead-letter queue (as `mgrpo dlq replay` does)."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.bus.control import TASK_REPLAY_DEAD_LETTERS, ReplayDeadLetters

    _send(TASK_REPLAY_DEAD_LETTERS, ReplayDeadLetters(limit=limit, source=queue), broker)


@app.command("start-round")
def start_round(run_id: str | None = typer.Option(None, "--run-id", help="Default: the run "
                                                  "config's name."),
                index: int | None = typer.Option(None, "--index", min=0, help="This round "
                                                 "(idempotent); default: the next one."),
                queries_per_round: int | None = typer.Option(None, "--queries-per-round",
                                                             min=1),
                k: int | None = typer.Option(None, "--k", min=1),
                broker: str | None = BROKER_OPTION) -> None:
    """Start a round of a run, as POST /v1/rounds does."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.bus.control import TASK_ROUND, StartRound

    _send(TASK_ROUND, StartRound(command="start", run_id=run_id, index=index,
                                 queries_per_round=queries_per_round, k=k), broker)


@app.command("cancel-round")
def cancel_round(round_id: str = typer.Argument(..., help="The round to cancel."),
                 broker: str | None = BROKER_OPTION) -> None:
    """Cancel a round, as POST /v1/rounds/{round_id}/cancel does."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.bus.control import TASK_ROUND, CancelRound

    _send(TASK_ROUND, CancelRound(command="cancel", round_id=round_id), broker)
