"""A ``turn_team`` round through the services: the same :class:`TeamSampler` as embedded
mode (``mgrpo.training.team_round``), each role's candidates sampled by that role's worker.

- Round shape: ``start_round`` picks B tasks of the world's training split (the same pure
  function of (seed, round) as embedded mode, :func:`team_queries`) and enqueues ONE
  ``EpisodeTask`` per task (rollout 0), as for the hierarchy's AT-GRPO trees; the task's K
  candidate slots are the round's K rollouts.
- Coordinator (``mgrpo.services.planner.team.TeamWorker``, on ``planner.episodes``, in the
  planner worker's place):
  holds the world and every task's state. At each team turn, for each role in the world's
  order, it sends the turn's K requests per live task (the role's observation as the
  prompt, seeds by (round, task, role, turn, k)) as ONE ``SubAgentCall`` with ``turn`` to
  that role's queue (``subagent.<role>``) through its ``RoleEngine``, applies the
  completions to copies of the states (``World.act``, the sandbox for tool roles), scores
  them and continues from the best: :class:`TeamSampler`, unchanged. Then each model's
  candidates go to ITS trainer (``trainer.<model>``), with the candidate counts of each role
  per slot recorded as d_k (the trainers' readiness, as for trees), and the slots complete.
- Role worker (``mgrpo.services.subagent.role.RoleWorker``, one deployment per role,
  registered in the store as an agent): samples the requests of each call with its model's
  newest weights of the round's run and replies with the completions. It plays no world:
  actions are applied where the states live.
- Trainers: unchanged (``tree_round.train_tree_model``: one group per (task, role, team
  turn) of K candidates, or ``workflow.grouping``'s).

Same seeds, same tokens, rewards, group statistics and weights as embedded mode:
``tests/integration/services/test_services_team.py``.

This module holds what both sides and ``start_round`` share: whether a run is a turn team,
and its training tasks (its world:
``mgrpo.workflows.world_for_run``). What it does NOT do: play (the coordinator and the role
workers), evaluate (held-out greedy play is embedded mode's, ``mgrpo train``) or train.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from mgrpo.envs.worlds import build_world
from mgrpo.training.config import RunConfig
from mgrpo.training.rounds import sample_questions
from mgrpo.workflows import TurnTeam


def is_team(cfg: RunConfig) -> bool:
    """A run whose workflow is a turn team (``turn_team`` or a plug-in's subclass)."""
    return isinstance(cfg.flow, TurnTeam)


@dataclass(frozen=True)
class TeamQuery:
    """A world task as ``start_round`` stores it (a query row: id, statement, solution)."""

    id: str
    question: str
    answer: str
    kind: str = "team"
    stage: int | None = None


@functools.lru_cache(maxsize=8)
def _task_pool(world_name: str, options: str, n: int, seed: int) -> tuple:
    return tuple(build_world(world_name, **json.loads(options)).tasks("train", n, seed))


def train_pool(cfg: RunConfig) -> tuple:
    """The training tasks a run's rounds sample from (embedded mode's ``pool``)."""
    flow = cfg.workflow
    return _task_pool(flow.world, json.dumps(flow.world_options, sort_keys=True),
                      flow.train_tasks, cfg.seed)


def team_queries(cfg: RunConfig, index: int) -> list[TeamQuery]:
    """Round ``index``'s tasks, as embedded mode samples them (``run_team_round``)."""
    tasks = sample_questions(list(train_pool(cfg)), cfg.queries_per_round, cfg.seed, index)
    return [TeamQuery(t.task_id, t.statement, str(t.solution)) for t in tasks]
