"""Queue topology and task names of the bus, as constants (stable: never derived from paths).

Queues (all durable, all dead-lettering into ``mgrpo.dead_letter``):
- ``planner.episodes``: episode tasks and round commands for planner workers.
- ``planner.replies``: sub-agent results coming back to the planner; the services use one
  per worker, ``planner.replies.<worker id>``, auto-delete and expiring (``topology``).
- ``trainer.<model>``: trajectories and round commands for ONE model's trainer.
- ``subagent.<name>``: calls to ONE tool sub-agent deployment.
Exchanges: ``mgrpo.weights`` (fanout: "model M has version v"; every agent worker binds its
own exclusive queue) and ``mgrpo.dead_letter`` (direct, routing key = the queue name
``mgrpo.dead_letter``).

What this module does NOT do: declare anything on a broker (``mgrpo.bus.kombu_bus``).
"""

from __future__ import annotations

import re

TASK_PLANNER_RUN_EPISODES = "planner.run_episodes"
TASK_PLANNER_SUBAGENT_RESULT = "planner.subagent_result"
TASK_SUBAGENT_RUN = "subagent.run"
TASK_TRAINER_INGEST = "trainer.ingest"
TASK_ROUND_COMMAND = "round.command"
TASK_AGENTS_WEIGHTS_UPDATED = "agents.weights_updated"

PLANNER_QUEUE = "planner.episodes"
PLANNER_REPLY_QUEUE = "planner.replies"
WEIGHTS_EXCHANGE = "mgrpo.weights"
DEAD_LETTER_EXCHANGE = "mgrpo.dead_letter"
DEAD_LETTER_QUEUE = "mgrpo.dead_letter"
REASON_HEADER = "x-mgrpo-reason"  # why a message was dead-lettered by us
SOURCE_QUEUE_HEADER = "x-mgrpo-source-queue"

_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,62}$")


def _checked(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r} must match {_NAME.pattern} (lower-case letters, "
                         "digits, '_' and '-'); rename it in the run config")
    return name


def trainer_queue(model: str) -> str:
    """``trainer.<model>``: the queue of one model's trainer."""
    return f"trainer.{_checked('model', model)}"


def subagent_queue(name: str) -> str:
    """``subagent.<name>``: the queue of one tool sub-agent deployment."""
    return f"subagent.{_checked('sub-agent', name)}"
