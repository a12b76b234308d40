"""Rewards and advantages for one model's share of a round (docs/algorithm.md, '1.2 Rewards'
and '1.3 Group-relative advantages').

The planner side scores each episode (:func:`score_episode`) and writes the outcome to the
stats store; a sub-agent trainer reads those outcomes back (``r_correct_main``) and never
sees the planner's tokens. :func:`build_samples` turns one model's trajectories plus the
outcomes into training samples with advantages, using only the math in ``mgrpo.algo``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mgrpo.algo import (
    group_stats,
    planner_advantages,
    planner_reward,
    subagent_advantages,
    subagent_reward,
)
from mgrpo.envs.judges import ExpertJudges, LLMExpertJudge, Verdict
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


def frac_zero_std(stats: list[GroupStat]) -> float:
    """Share of groups whose rewards are all equal (TRL's ``frac_reward_zero_std``): their
    advantages are 0, so they teach nothing. A group of one counts as constant."""
    return sum(s.std < 1e-8 for s in stats) / len(stats) if stats else 0.0


def score_episode(answer: str | None, format_ok: bool, gold: str, verifier,
                  weights: tuple[float, float], question: str | None = None
                  ) -> tuple[float, float]:
    """Planner reward R_M (Eq. 4) -> (correct, reward). ``question``: its text, for a
    verifier that reads it (``verifier.score(answer, gold, question)``)."""
    correct = float(verifier.score(answer or "", gold, question)) if format_ok else 0.0
    reward = float(planner_reward(format_ok, correct, weights))
    return correct, reward


def expert_verdicts(trajs: list[Trajectory], judge) -> list[Verdict]:
    """r_expert of each trajectory, batched per role when the judge has ``verdicts`` (an LLM
    judge generates all of a role's prompts in one call); a judge with only ``judge()`` gives
    plain ``ok`` verdicts."""
    batched = getattr(judge, "verdicts", None)
    if batched is None:
        return [Verdict(float(judge.judge(t.agent, t.subtask or "", t.result or "")))
                for t in trajs]
    out: list[Verdict | None] = [None] * len(trajs)
    for agent in dict.fromkeys(t.agent for t in trajs):
        idx = [i for i, t in enumerate(trajs) if t.agent == agent]
        pairs = [(trajs[i].subtask or "", trajs[i].result or "") for i in idx]
        if isinstance(judge, ExpertJudges | LLMExpertJudge):  # they show the evidence
            found = batched(agent, pairs, evidence=[
                list(trajs[i].extra.get("observations", [])) for i in idx])
        else:
            found = batched(agent, pairs)
        for i, verdict in zip(idx, found, strict=True):
            out[i] = verdict
    return out  # type: ignore[return-value]


def subagent_rewards(trajs: list[Trajectory], outcomes: dict[tuple[str, int], PlannerOutcome],
                     judge, weights: tuple[float, float, float],
                     counts: dict[str, int] | None = None) -> list[float]:
    """R_S for each sub-agent invocation (Eq. 5): r_correct_main comes from the planner's
    outcome of the rollout that made the call (read from the store by the caller). r_expert
    is judged only for format-valid invocations; ``counts`` (if given) receives how many
    verdicts had each status (``ok``, ``no_truth``, ``parse_failure``)."""
    valid = [t for t in trajs if t.format_ok]
    verdicts = iter(expert_verdicts(valid, judge))
    rewards = []
    for traj in trajs:
        main = outcomes[(traj.query_id, traj.rollout)].correct
        expert = 0.0
        if traj.format_ok:
            verdict = next(verdicts)
            expert = float(verdict.score)
            if counts is not None:
                counts[verdict.status] = counts.get(verdict.status, 0) + 1
        rewards.append(float(subagent_reward(traj.format_ok, main, expert, weights)))
    return rewards


def _stats(agent: str, rewards: torch.Tensor, group_ids: torch.Tensor, keys: list[str],
           mask: torch.Tensor | None = None) -> list[GroupStat]:
    stats = group_stats(rewards, group_ids, mask=mask)
    return [GroupStat(agent, keys[int(g)], int(n), float(m), float(s))
            for g, n, m, s in zip(*stats, strict=True)]


def _index(keys: list[str]) -> dict[str, int]:
    return {k: i for i, k in enumerate(keys)}


def planner_samples(trajs: list[Trajectory], outcomes: dict[tuple[str, int], PlannerOutcome],
                    cfg: RunConfig, penalties: list[float] | None = None,
                    ) -> tuple[list[Sample], list[GroupStat]]:
    """Planner advantages: one group per query over its K rollouts (Eq. 6-8). ``penalties``
    (one per trajectory, ``loss.kl_in_reward``) are subtracted from the rewards first."""
    if not trajs:
        return [], []
    keys = sorted({t.query_id for t in trajs})
    index = _index(keys)
    rewards = torch.tensor([outcomes[(t.query_id, t.rollout)].reward for t in trajs])
    if penalties is not None:
        rewards = rewards - torch.tensor(penalties, dtype=rewards.dtype)
    groups = torch.tensor([index[t.query_id] for t in trajs], dtype=torch.long)
    adv = planner_advantages(rewards, groups, scale=cfg.loss.scale, eps=cfg.loss.eps,
                             dynamic_sampling=cfg.loss.dynamic_sampling)
    samples = [Sample(t, float(a), float(r))
               for t, a, r, keep in zip(trajs, adv.advantages, rewards, adv.keep, strict=True)
               if keep]
    return samples, _stats(trajs[0].agent, rewards, groups, keys)


def subagent_samples(trajs: list[Trajectory], rewards: list[float], k: int, d: int,
                     cfg: RunConfig, seed: int) -> tuple[list[Sample], list[GroupStat]]:
    """Sub-agent advantages for ONE role (Eq. 9-13): per query, every rollout aligned to d
    slots (duplicate/drop uniformly, d_k = 0 masked), statistics over the live slots. A
    duplicated trajectory yields two samples, as in the paper."""
    if not trajs:
        return [], []
    keys = sorted({t.query_id for t in trajs})
    index = _index(keys)
    aligned = subagent_advantages(
        torch.tensor([index[t.query_id] for t in trajs], dtype=torch.long),
        torch.tensor([t.rollout for t in trajs], dtype=torch.long),
        torch.tensor(rewards, dtype=torch.float32), num_rollouts=k, d=d,
        generator=torch.Generator().manual_seed(seed), scale=cfg.loss.scale, eps=cfg.loss.eps,
        dynamic_sampling=cfg.loss.dynamic_sampling)
    samples = [Sample(trajs[int(i)], float(a), float(r))
               for i, a, r, keep in zip(aligned.traj_index, aligned.advantages,
                                        aligned.rewards, aligned.keep, strict=True) if keep]
    live = aligned.weight > 0
    return samples, _stats(trajs[0].agent, aligned.rewards, aligned.group_ids, keys, mask=live)


def d_counts(trajs: list[Trajectory], query_rollouts: list[tuple[str, int]]) -> list[DCount]:
    """Observed d_k (calls of one role per rollout), zeros included."""
    counts = dict.fromkeys(query_rollouts, 0)
    for t in trajs:
        counts[(t.query_id, t.rollout)] = counts.get((t.query_id, t.rollout), 0) + 1
    return [DCount(query_id=q, rollout=r, d=d) for (q, r), d in counts.items()]
