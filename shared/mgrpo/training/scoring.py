"""Rewards and advantages for one model's share of a round (docs/algorithm.md, '1.2 Rewards'
and '1.3 Group-relative advantages').

The planner side scores each episode (:func:`score_episode`) and writes the outcome to the
stats store; a sub-agent trainer reads those outcomes back (``r_correct_main``) and never
sees the planner's tokens. :func:`build_samples` turns one model's trajectories plus the
outcomes into training samples with advantages: :func:`estimate` calls the run's registered
advantage estimator (``mgrpo.algo.estimators``) on an :class:`AdvantageBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mgrpo.algo import group_stats, planner_reward, subagent_reward
from mgrpo.algo.estimators import (
    AdvantageBatch,
    Advantages,
    Alignment,
    EstimatorConfig,
    get_estimator,
)
from mgrpo.envs.judges import ExpertJudges, LLMExpertJudge, Verdict
from mgrpo.store.records import DCount
from mgrpo.store.records import PlannerOutcomeIn as PlannerOutcome
from mgrpo.training.config import LossConfig, RunConfig
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


def _index(values) -> dict:
    return {v: i for i, v in enumerate(sorted(set(values)))}


def advantage_batch(trajs: list[Trajectory], rewards: torch.Tensor,
                    alignment: Alignment | None = None) -> AdvantageBatch:
    """``trajs`` as an estimator's batch: query and agent as indices into their sorted ids,
    the turn (0 where a trajectory has none) and the rollout."""
    queries, agents = _index(t.query_id for t in trajs), _index(t.agent for t in trajs)
    return AdvantageBatch(
        rewards=rewards,
        query_ids=torch.tensor([queries[t.query_id] for t in trajs], dtype=torch.long),
        agent_ids=torch.tensor([agents[t.agent] for t in trajs], dtype=torch.long),
        turn_ids=torch.tensor([int(t.turn or 0) for t in trajs], dtype=torch.long),
        rollout_ids=torch.tensor([t.rollout for t in trajs], dtype=torch.long),
        alignment=alignment)


def estimator_config(loss: LossConfig, grouping: str = "agent_turn") -> EstimatorConfig:
    """The loss options an estimator reads, and the grouping of (query, agent, turn)."""
    return EstimatorConfig(scale=loss.scale, eps=loss.eps,
                           dynamic_sampling=loss.dynamic_sampling, grouping=grouping)


def estimate(batch: AdvantageBatch, cfg: RunConfig) -> Advantages:
    """The run's advantage estimator (:meth:`RunConfig.advantage_estimator`) on ``batch``;
    the grouping is the workflow's (``workflow.grouping``), else the algorithm's."""
    grouping = cfg.workflow.grouping if cfg.workflow is not None else cfg.algo.grouping
    return get_estimator(cfg.advantage_estimator())(batch, estimator_config(cfg.loss, grouping))


def advantage_samples(trajs: list[Trajectory], rewards: torch.Tensor, cfg: RunConfig,
                      alignment: Alignment | None = None) -> tuple[list[Sample], Advantages]:
    """One role's trajectories and rewards -> the kept rows as samples (a row the estimator
    duplicated, as alignment does, is two samples), and the estimator's rows."""
    adv = estimate(advantage_batch(trajs, rewards, alignment), cfg)
    samples = [Sample(trajs[int(i)], float(a), float(r))
               for i, a, r, keep in zip(adv.sample, adv.advantages, adv.rewards, adv.keep,
                                        strict=True) if keep]
    return samples, adv


def query_group_stats(trajs: list[Trajectory], adv: Advantages) -> list[GroupStat]:
    """One :class:`GroupStat` per advantage group over its live rows (a masked slot is not
    one), keyed by the query ids of its samples."""
    live = adv.sample >= 0
    keys: dict[int, set[str]] = {}
    for g, i in zip(adv.group_ids[live].tolist(), adv.sample[live].tolist(), strict=True):
        keys.setdefault(g, set()).add(trajs[i].query_id)
    stats = group_stats(adv.rewards, adv.group_ids, mask=live)
    return [GroupStat(trajs[0].agent, "+".join(sorted(keys[int(g)])), int(n), float(m),
                      float(s)) for g, n, m, s in zip(*stats, strict=True)]


def planner_samples(trajs: list[Trajectory], outcomes: dict[tuple[str, int], PlannerOutcome],
                    cfg: RunConfig, penalties: list[float] | None = None,
                    ) -> tuple[list[Sample], list[GroupStat]]:
    """The planner's samples: its rewards R_M (Eq. 4) through the run's estimator (M-GRPO,
    GRPO: one group per query over its K rollouts, Eq. 6-8). ``penalties`` (one per
    trajectory, ``loss.kl_in_reward``) are subtracted from the rewards first."""
    if not trajs:
        return [], []
    rewards = torch.tensor([outcomes[(t.query_id, t.rollout)].reward for t in trajs])
    if penalties is not None:
        rewards = rewards - torch.tensor(penalties, dtype=rewards.dtype)
    samples, adv = advantage_samples(trajs, rewards, cfg)
    return samples, query_group_stats(trajs, adv)


def subagent_samples(trajs: list[Trajectory], rewards: list[float], k: int, d: int,
                     cfg: RunConfig, seed: int) -> tuple[list[Sample], list[GroupStat]]:
    """The samples of ONE sub-agent role through the run's estimator, with the alignment
    (K rollouts to d slots, drawn with ``seed``) for one that aligns (M-GRPO, Eq. 9-13: per
    query, every rollout aligned to d slots, d_k = 0 masked, statistics over the live
    slots)."""
    if not trajs:
        return [], []
    samples, adv = advantage_samples(trajs, torch.tensor(rewards, dtype=torch.float32), cfg,
                                     Alignment(num_rollouts=k, d=d, seed=seed))
    return samples, query_group_stats(trajs, adv)


def d_counts(trajs: list[Trajectory], query_rollouts: list[tuple[str, int]]) -> list[DCount]:
    """Observed d_k (calls of one role per rollout), zeros included."""
    counts = dict.fromkeys(query_rollouts, 0)
    for t in trajs:
        counts[(t.query_id, t.rollout)] = counts.get((t.query_id, t.rollout), 0) + 1
    return [DCount(query_id=q, rollout=r, d=d) for (q, r), d in counts.items()]
