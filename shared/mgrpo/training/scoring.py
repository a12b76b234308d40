"""Rewards and advantages for one model's share of a round (SPEC 1.2-1.3).

The planner side scores each episode (:func:`score_episode`) and writes the outcome to the
stats store; a sub-agent trainer reads those outcomes back (``r_correct_main``) and never
sees the planner's tokens. :func:`build_samples` turns one model's trajectories plus the
outcomes into training samples with advantages, using only the math in ``mgrpo.algo``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from mgrpo.algo import align_subagents, group_advantages, group_stats
from mgrpo.algo import planner_reward, subagent_reward
from mgrpo.store.records import DCount
from mgrpo.store.records import PlannerOutcomeIn as PlannerOutcome
from mgrpo.training.config import RunConfig
from mgrpo.types import Trajectory


@dataclass
class Sample:
    """One training sample: a trajectory and its advantage (a duplicated sub-agent
    trajectory is two samples, as in the paper's alignment)."""

    trajectory: Trajectory
    advantage: float
    reward: float


@dataclass
class GroupStat:
    agent: str
    group_key: str
    n: int
    mean: float
    std: float


def score_episode(answer: str | None, format_ok: bool, gold: str, verifier,
                  weights: tuple[float, float]) -> tuple[float, float]:
    """Planner reward R_M (Eq. 4) -> (correct, reward)."""
    correct = float(verifier.score(answer or "", gold)) if format_ok else 0.0
    reward = float(planner_reward(format_ok, correct, weights))
    return correct, reward


def subagent_rewards(trajs: list[Trajectory], outcomes: dict[tuple[str, int], PlannerOutcome],
                     judge, weights: tuple[float, float, float]) -> list[float]:
    """R_S for each sub-agent invocation (Eq. 5): r_correct_main comes from the planner's
    outcome of the rollout that made the call (read from the store by the caller)."""
    rewards = []
    for traj in trajs:
        main = outcomes[(traj.query_id, traj.rollout)].correct
        expert = float(judge.judge(traj.agent, traj.subtask or "", traj.result or "")
                       if traj.format_ok else 0.0)
        rewards.append(float(subagent_reward(traj.format_ok, main, expert, weights)))
    return rewards


def _stats(agent: str, rewards: torch.Tensor, group_ids: torch.Tensor,
           keys: list[str]) -> list[GroupStat]:
    ids, count, mean, std = group_stats(rewards, group_ids)
    return [GroupStat(agent, keys[int(g)], int(n), float(m), float(s))
            for g, n, m, s in zip(ids, count, mean, std, strict=True)]


def planner_samples(trajs: list[Trajectory], outcomes: dict[tuple[str, int], PlannerOutcome],
                    cfg: RunConfig) -> tuple[list[Sample], list[GroupStat]]:
    """Planner advantages: one group per query over its K rollouts (Eq. 6-8)."""
    keys = sorted({t.query_id for t in trajs})
    index = {k: i for i, k in enumerate(keys)}
    rewards = torch.tensor([outcomes[(t.query_id, t.rollout)].reward for t in trajs])
    groups = torch.tensor([index[t.query_id] for t in trajs], dtype=torch.long)
    adv = group_advantages(rewards, groups, scale=cfg.loss.scale, eps=cfg.loss.eps)
    samples = [Sample(t, float(a), float(r)) for t, a, r in zip(trajs, adv, rewards, strict=True)]
    return samples, _stats(trajs[0].agent if trajs else "planner", rewards, groups, keys)


def subagent_samples(trajs: list[Trajectory], rewards: list[float], k: int, d: int,
                     cfg: RunConfig, seed: int) -> tuple[list[Sample], list[GroupStat]]:
    """Sub-agent advantages for ONE role: per query, align every rollout to d slots
    (duplicate/drop uniformly, d_k = 0 masked), then group statistics over the query's
    live slots (Eq. 9-13)."""
    by_query: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        by_query[t.query_id].append(i)
    generator = torch.Generator().manual_seed(seed)
    slot_traj, slot_group, keys = [], [], []
    for g, query_id in enumerate(sorted(by_query)):
        members = by_query[query_id]
        rollout_index = torch.tensor([trajs[i].rollout for i in members], dtype=torch.long)
        index, weight = align_subagents(rollout_index, num_rollouts=k, d=d, generator=generator)
        for j, w in zip(index.tolist(), weight.tolist(), strict=True):
            if w > 0:
                slot_traj.append(members[j])
                slot_group.append(g)
        keys.append(query_id)
    if not slot_traj:
        return [], []
    slot_rewards = torch.tensor([rewards[i] for i in slot_traj])
    groups = torch.tensor(slot_group, dtype=torch.long)
    adv = group_advantages(slot_rewards, groups, scale=cfg.loss.scale, eps=cfg.loss.eps)
    samples = [Sample(trajs[i], float(a), float(r))
               for i, a, r in zip(slot_traj, adv, slot_rewards, strict=True)]
    return samples, _stats(trajs[0].agent, slot_rewards, groups, keys)


def d_counts(trajs: list[Trajectory], query_rollouts: list[tuple[str, int]]) -> list[DCount]:
    """Observed d_k (calls of one role per rollout), zeros included."""
    counts = dict.fromkeys(query_rollouts, 0)
    for t in trajs:
        counts[(t.query_id, t.rollout)] = counts.get((t.query_id, t.rollout), 0) + 1
    return [DCount(query_id=q, rollout=r, d=d) for (q, r), d in counts.items()]
