"""The steps of one training round (docs/services.md, 'One round (distributed)'), shared by
embedded mode and the services.

1. :func:`collect` plays B queries x K rollouts.
2. :func:`score` turns each episode into the planner's outcome (what the store holds and the
   sub-agent trainers read back).
3. :func:`train_model` is one trainer's whole job for one model and round: rewards, group
   statistics (returned, for the store), alignment, advantages, update.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict

import torch

from mgrpo.algo import auto_d
from mgrpo.parallel.sharding import SINGLE, DataParallel
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import Episode, EpisodeJob, mix_seed
from mgrpo.training.reference import (
    current_kl_coef,
    reference_for,
    reward_kl_penalties,
    update_kl_coef,
)
from mgrpo.training.scoring import (
    GroupStat,
    PlannerOutcome,
    Sample,
    frac_zero_std,
    planner_samples,
    score_episode,
    subagent_rewards,
    subagent_samples,
)
from mgrpo.training.update import UpdateSpec, policy_update, qualify
from mgrpo.types import Trajectory

log = logging.getLogger(__name__)


def sample_questions(pool: list, n: int, seed: int, round_index: int) -> list:
    """B questions for a round, a pure function of (seed, round) so a resumed run repeats it."""
    rng = random.Random(mix_seed(seed, "round", round_index))
    return rng.sample(pool, min(n, len(pool)))


def collect(system, round_id: str, questions: list, k: int, seed: int, attempt: int = 0,
            greedy: bool = False) -> list[Episode]:
    jobs = [EpisodeJob(q, round_id, r, mix_seed(seed, round_id, q.id, r), attempt)
            for q in questions for r in range(k)]
    return system.runner(greedy).run(jobs, greedy=greedy)


def score(system, episodes: list[Episode]) -> list[PlannerOutcome]:
    out = []
    for ep in episodes:
        correct, reward = score_episode(ep.answer, ep.format_ok, ep.job.question.answer,
                                        system.verifier, system.cfg.rewards.planner,
                                        question=ep.job.question.question)
        out.append(PlannerOutcome(query_id=ep.job.question.id, rollout=ep.job.rollout,
                                  attempt=ep.job.attempt, format_ok=ep.format_ok,
                                  correct=correct, reward=reward))
    return out


def choose_d(cfg: RunConfig, observed: list[int]) -> int:
    """Alignment's d (docs/algorithm.md, 'Sub-agents: trajectory alignment'): a fixed d, or auto:
    the 99th percentile of observed d_k (>= 1)."""
    if cfg.d != "auto":
        return int(cfg.d)
    return int(auto_d(torch.tensor(observed or [1]), quantile=0.99))


def observed_d(store, run_id: str, roles: list[str]) -> dict[str, list[int]]:
    """d_k observed so far in run ``run_id`` per sub-agent role: the input of ``d: auto``.
    Per run, not the store's whole history (a shared store holds other runs, whose call
    counts say nothing about this one's policies)."""
    return {r: store.d_counts(r, run_id=run_id) for r in roles if r != "planner"}


_warned_no_truth: set[str] = set()


def judge_metrics(role: str, counts: dict[str, int]) -> dict[str, float]:
    """r_expert verdicts that were not real judgements, as metrics, with a warning: a task
    without ground truth under the rule judge, an LLM judge reply that was neither yes nor
    no. Both score 0; neither may pass unnoticed. The no-ground-truth warning is logged once
    per role and process (it repeats every round otherwise); the metric counts every round."""
    judged = sum(counts.values())
    no_truth, failed = counts.get("no_truth", 0), counts.get("parse_failure", 0)
    errors = counts.get("error", 0)
    if no_truth and role not in _warned_no_truth:
        _warned_no_truth.add(role)
        log.warning("r_expert: %d of %d %s results have no ground truth for the rule judge "
                    "and scored 0; judge them with `judges: {%s: {kind: llm, model: ...}}` "
                    "or set rewards.subagent b3=0 (logged once; see the metric %s/expert_no_truth)",
                    no_truth, judged, role, role, role)
    if failed:
        log.warning("r_expert: the LLM judge of %s answered neither yes nor no for %d of %d "
                    "results (scored 0)", role, failed, judged)
    if errors:
        log.warning("r_expert: the judge function of %s raised or returned no number in [0, "
                    "1] for %d of %d results (scored 0)", role, errors, judged)
    return {f"{role}/expert_judged": float(judged), f"{role}/expert_no_truth": float(no_truth),
            f"{role}/judge_parse_failures": float(failed), f"{role}/judge_errors": float(errors)}


def train_model(lm, roles: list[str], trajs: list[Trajectory],
                outcomes: dict[tuple[str, int], PlannerOutcome], cfg: RunConfig, judge,
                d_observed: dict[str, list[int]], round_index: int
                ) -> tuple[dict[str, float], list[GroupStat]]:
    """One trainer's round for model ``lm`` (which may serve several ``roles``)."""
    by_role: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_role[t.agent].append(t)
    samples: list[Sample] = []
    stats: list[GroupStat] = []
    metrics: dict[str, float] = {}
    round_penalties: list[float] = []
    for role in roles:
        role_trajs = by_role.get(role, [])
        penalties = reward_kl_penalties(lm, role_trajs, cfg)  # zeros unless kl_in_reward
        if cfg.loss.kl_in_reward and role_trajs:
            metrics[f"{role}/kl_penalty"] = sum(penalties) / len(penalties)
            round_penalties += penalties
        if role == "planner":
            role_samples, role_stats = planner_samples(role_trajs, outcomes, cfg,
                                                       penalties=penalties)
        else:
            counts: dict[str, int] = {}
            rewards = subagent_rewards(role_trajs, outcomes, judge, cfg.rewards.subagent,
                                       counts=counts)
            rewards = [r - p for r, p in zip(rewards, penalties, strict=True)]
            metrics.update(judge_metrics(role, counts))
            d = choose_d(cfg, d_observed.get(role, []))
            metrics[f"{role}/d"] = float(d)
            role_samples, role_stats = subagent_samples(
                role_trajs, rewards, cfg.k, d, cfg, seed=mix_seed(cfg.seed, role, round_index))
        samples += role_samples
        stats += role_stats
        if role_stats:
            metrics[f"{role}/frac_reward_zero_std"] = frac_zero_std(role_stats)
        if role_samples:
            rewards_t = torch.tensor([s.reward for s in role_samples])
            adv_t = torch.tensor([s.advantage for s in role_samples])
            metrics[f"{role}/reward_mean"] = float(rewards_t.mean())
            metrics[f"{role}/reward_std"] = float(rewards_t.std(unbiased=False))
            metrics[f"{role}/adv_abs_mean"] = float(adv_t.abs().mean())
            metrics[f"{role}/samples"] = float(len(role_samples))
    metrics.update(update_model(lm, samples, cfg, round_index))
    if round_penalties:  # the coefficient this round used; the next round's is stepped
        metrics[f"{lm.name}/kl_coef"] = current_kl_coef(lm, cfg.loss)
        update_kl_coef(lm, cfg.loss, round_penalties)
    return metrics, stats


def update_model(lm, samples: list[Sample], cfg: RunConfig, round_index: int
                 ) -> dict[str, float]:
    """One round's policy update of ``lm`` on ``samples`` (seeded by model and round), its
    metrics qualified by the model's name; nothing when ``lm`` is frozen or has no samples.
    Shared by :func:`train_model` and the tree round (``mgrpo.training.tree_round``)."""
    if lm.optimizer is None or not samples:
        return {}
    ranks = getattr(lm, "ranks", None)
    if ranks is not None:  # a torchrun trainer (mgrpo.parallel.ranks): every rank
        return ranks.update(lm, samples, cfg, round_index)
    return local_update(lm, samples, cfg, round_index)


def local_update(lm, samples: list[Sample], cfg: RunConfig, round_index: int,
                 parallel: DataParallel = SINGLE) -> dict[str, float]:
    """:func:`update_model` in this process; ``parallel``: this rank's place when it is one
    rank of a data-parallel update (the model it runs: ``lm.model`` or its DDP wrapper)."""
    mcfg = cfg.models[lm.name]
    generator = torch.Generator().manual_seed(mix_seed(cfg.seed, lm.name, round_index))
    ref_model = reference_for(lm, mcfg, cfg.loss, run_id=cfg.name,
                              sharded=parallel.fsdp(lm.model)) if cfg.loss.kl_in_loss() else None
    update = policy_update(parallel.module(lm.model), lm.optimizer, samples,
                           UpdateSpec.for_run(cfg, lm.name, lm.tokenizer.pad_token_id),
                           ref_model=ref_model, generator=generator, parallel=parallel)
    return qualify(update, lm.name)
