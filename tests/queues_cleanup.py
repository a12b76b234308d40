"""Delete test queues on the real RabbitMQ (a queue already gone is fine)."""

from __future__ import annotations

from collections.abc import Iterable

from kombu import Connection

MODELS = ("planner", "searcher", "coder")
SUBAGENTS = ("searcher", "coder")


def delete_queues(url: str, *names: str) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except Exception:  # noqa: BLE001 - already gone
                channel = connection.channel()


def delete_run_queues(url: str, queues, *, models: Iterable[str] = MODELS,
                      subagents: Iterable[str] = SUBAGENTS, extra: Iterable[str] = ()) -> None:
    """Delete one deployment's work queues: the planner's episodes, the dead letters, each
    model's trainer queue, each sub-agent's queue, and ``extra`` (full names).
    ``queues`` is the deployment's ``mgrpo.services.context.Queues``."""
    delete_queues(url, queues.episodes, queues.dead_letter,
                  *(queues.trainer(m) for m in models),
                  *(queues.subagent(a) for a in subagents), *extra)
