"""`mgrpo dlq ...`: look at and replay the dead-letter queue of a distributed deployment.

A message lands there when it could not be handled (malformed, wrong kind, a handler error that
is the message's fault), with the reason and its source queue in headers. Once the cause is
fixed (a redeployed worker, a registered sub-agent), ``replay`` publishes the letters back to
the queue they came from, as they were; a replayed message that still fails comes back with a
fresh reason. The broker is ``--broker`` or ``MGRPO_BROKER_URL``; the queue is
``<MGRPO_QUEUE_PREFIX>mgrpo.dead_letter``.

What this does NOT do: edit messages, or replay in embedded mode (its bus dies with the run).
"""

from __future__ import annotations

import json

import typer

app = typer.Typer(no_args_is_help=True)

BROKER_OPTION = typer.Option(None, "--broker", help="AMQP URL; default: MGRPO_BROKER_URL.")
LIMIT_OPTION = typer.Option(1000, "--limit", min=1, help="At most this many letters.")


def _bus(broker: str | None):
    from mgrpo.bus.kombu_bus import KombuBus
    from mgrpo.config import get_settings
    from mgrpo.services.context import Queues

    settings = get_settings()
    return KombuBus(broker or settings.broker_url,
                    dead_letter_queue_name=Queues(settings.queue_prefix).dead_letter)


def _line(letter) -> str:
    try:
        kind = json.loads(letter.body).get("kind", "?")
    except (ValueError, AttributeError):
        kind = "(not JSON)"
    return json.dumps({"queue": letter.queue, "kind": kind, "reason": letter.reason,
                       "body": letter.body[:200]})


@app.command("list")
def list_letters(broker: str | None = BROKER_OPTION, limit: int = LIMIT_OPTION) -> None:
    """Print the dead letters (one JSON line each: source queue, kind, reason, body head);
    they stay in the queue."""
    bus = _bus(broker)
    try:
        letters = bus.peek_dead_letters(limit)
    finally:
        bus.close()
    for letter in letters:
        typer.echo(_line(letter))
    typer.echo(f"{len(letters)} dead letter(s) in {bus.dead_letter_queue_name}", err=True)


@app.command()
def replay(broker: str | None = BROKER_OPTION, limit: int = LIMIT_OPTION,
           queue: str | None = typer.Option(
               None, "--queue", help="Only letters from this source queue (full name).")
           ) -> None:
    """Publish dead letters back to their source queues (the others stay dead-lettered)."""
    bus = _bus(broker)
    try:
        replayed = bus.replay_dead_letters(limit, source=queue)
    finally:
        bus.close()
    for letter in replayed:
        typer.echo(_line(letter))
    typer.echo(f"replayed {len(replayed)} dead letter(s)", err=True)
