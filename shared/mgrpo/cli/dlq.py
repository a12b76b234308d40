"""`mgrpo dlq ...`: look at and replay the dead-letter queue of a distributed deployment.

A message lands there when it could not be handled (malformed, wrong kind, a handler error that
is the message's fault), with the reason and its source queue in headers. Once the cause is
fixed (a redeployed worker, a registered sub-agent), ``replay`` publishes the letters back to
the queue they came from, as they were; a replayed message that still fails comes back with a
fresh reason. The broker is ``--broker`` or ``MGRPO_BROKER_URL``; the queue is
``<MGRPO_QUEUE_PREFIX>mgrpo.dead_letter``.

One ``list`` or ``replay`` pass at a time per dead-letter queue: a second one waits (up to
2 minutes) for the first (``mgrpo.bus.kombu_bus.DEAD_LETTER_LOCK_WAIT_S``).

What this does NOT do: edit messages, or replay in embedded mode (its bus dies with the run).
"""

from __future__ import annotations

import json

import typer

app = typer.Typer(no_args_is_help=True)

BROKER_OPTION = typer.Option(None, "--broker", help="AMQP URL; default: MGRPO_BROKER_URL.")
LIMIT_OPTION = typer.Option(1000, "--limit", min=1, help="At most this many letters.")


def _bus(broker: str | None):
    # on use: keeps torch, sqlalchemy, kombu out of the CLI's start
    from mgrpo.bus.kombu_bus import KombuBus
    from mgrpo.config import get_settings
    from mgrpo.services.context import Queues

    settings = get_settings()
    return KombuBus(broker or settings.broker_url,
                    dead_letter_queue_name=Queues(settings.queue_prefix).dead_letter)


def _line(letter, action: str | None = None) -> str:
    try:
        kind = json.loads(letter.body).get("kind", "?")
    except (ValueError, AttributeError):
        kind = "(not JSON)"
    line = {"queue": letter.queue, "kind": kind, "reason": letter.reason,
            "body": letter.body[:200]}
    return json.dumps(line if action is None else {"action": action, **line})


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
    """Publish dead letters back to their source queues (the others stay dead-lettered).

    One line per letter read (``"action"``: ``replayed`` or ``kept``), then the account:
    replayed + kept = read, and how many were in the queue when the pass began. Two replays
    (or a replay and a list) at once take turns: a lock on the broker (an exclusive queue,
    released when its holder's connection ends, even by a crash)."""
    bus = _bus(broker)
    try:
        replayed, kept, count = bus.replay_report(limit, source=queue)
    finally:
        bus.close()
    for letter in replayed:
        typer.echo(_line(letter, "replayed"))
    for letter in kept:
        typer.echo(_line(letter, "kept"))
    read = len(replayed) + len(kept)
    unread = f"; {count - read} left unread (--limit {limit})" if count > read else ""
    typer.echo(f"replayed {len(replayed)} dead letter(s), kept {len(kept)} (no source queue"
               f"{' or not from ' + queue if queue else ''}) of {read} read; {count} were in "
               f"{bus.dead_letter_queue_name} when the replay began{unread}", err=True)
