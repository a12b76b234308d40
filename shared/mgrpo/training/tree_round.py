"""AT-GRPO's round around the tree sampler (``mgrpo.training.tree``), shared by both modes:
:func:`at_grpo_samples` (the run's estimator on the candidates: AT-GRPO's groups each
(query, agent, turn) of K),
:func:`train_tree_model` (one model's share: samples, group statistics, metrics, update;
what embedded mode's round and the services' trainer both call), :func:`train_tree_models`
(every model's share in this process: the embedded hierarchy's and turn team's rounds),
:func:`ingest_trees` and the embedded round :func:`run_at_grpo_round`.

What this module does not do: sample (``mgrpo.training.tree``) or play trees over the bus
(``mgrpo.services.tree_calls``).
"""

from __future__ import annotations

from typing import Any

import torch

from mgrpo.store.records import PlannerOutcomeIn
from mgrpo.training import rounds
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import mix_seed
from mgrpo.training.round_store import open_round, publish_stats, round_id_of
from mgrpo.training.rounds import sample_questions
from mgrpo.training.run_state import save_state
from mgrpo.training.scoring import (
    GroupStat,
    Sample,
    advantage_samples,
    frac_zero_std,
    score_episode,
)
from mgrpo.training.tree import TreeEpisode, TreeSampler
from mgrpo.types import Trajectory


def tree_seed(cfg: RunConfig, round_index: int) -> int:
    """The seed of a round's trees (each candidate's draw mixes in query, agent, turn, k)."""
    return mix_seed(cfg.seed, "at_grpo", round_index)


def at_grpo_samples(trajs: list[Trajectory], cfg: RunConfig) -> tuple[list[Sample],
                                                                      list[GroupStat]]:
    """Advantages for the candidates of one model through the run's estimator (AT-GRPO's:
    GRPO within each (query, agent, turn) group of K candidates; ``workflow.grouping`` may
    pool roles and/or turns instead); rewards are the stored turn rewards."""
    if not trajs:
        return [], []
    missing = [t.traj_id for t in trajs if t.reward is None or t.turn is None]
    if missing:
        raise ValueError(f"AT-GRPO samples need `reward` and `turn` on every trajectory; "
                         f"{missing[:3]} lack them (were they made by TreeSampler?)")
    samples, adv = advantage_samples(trajs, torch.tensor([float(t.reward) for t in trajs]),
                                     cfg)
    live = adv.sample >= 0
    rows = [trajs[i] for i in adv.sample[live].tolist()]
    return samples, role_group_stats(rows, adv.rewards[live], adv.group_ids[live])


def role_group_stats(trajs: list[Trajectory], rewards: torch.Tensor,
                     group_ids: torch.Tensor) -> list[GroupStat]:
    """One :class:`GroupStat` per (advantage group, role among its members): the group's
    count, mean and population std (what its advantages used), filed under each role that
    has samples in it, so a pooled grouping (``agent``, ``turn``, ``naive``) counts a
    group in every role's ``{role}/frac_reward_zero_std``. The key names the group: task,
    role and team turn, or ``*`` where the grouping pools them."""
    ids = group_ids.tolist()
    stats = []
    for g in sorted(set(ids)):
        members = [i for i, gid in enumerate(ids) if gid == g]
        r = rewards[members]
        roles = sorted({trajs[i].agent for i in members})
        turns = sorted({int(trajs[i].turn) for i in members})
        who = roles[0] if len(roles) == 1 else "*"
        when = f"t{turns[0]}" if len(turns) == 1 else "t*"
        for role in roles:
            stats.append(GroupStat(role, f"{trajs[members[0]].query_id}|{who}|{when}",
                                   len(members), float(r.mean()), float(r.std(unbiased=False))))
    return stats


def train_tree_model(lm, roles: list[str], trajs: list[Trajectory], cfg: RunConfig,
                     round_index: int) -> tuple[dict[str, float], list[GroupStat]]:
    """One model's share of an AT-GRPO round: its roles' candidates -> samples and group
    statistics, ``{role}/turn_reward_mean`` and ``{role}/samples``, then the update (none
    for a frozen model). Returns (metrics, stats)."""
    trajs = [t for t in trajs if t.agent in roles]
    samples, stats = at_grpo_samples(trajs, cfg)
    metrics: dict[str, float] = {}
    for role in roles:
        rewards = [s.reward for s in samples if s.trajectory.agent == role]
        if rewards:
            metrics[f"{role}/turn_reward_mean"] = sum(rewards) / len(rewards)
            metrics[f"{role}/samples"] = float(len(rewards))
        if role_stats := [s for s in stats if s.agent == role]:
            metrics[f"{role}/frac_reward_zero_std"] = frac_zero_std(role_stats)
    metrics.update(rounds.update_model(lm, samples, cfg, round_index))
    return metrics, stats


def ingest_trees(store, round_id: str, trees: list[TreeEpisode], cfg: RunConfig,
                 verifier: Any) -> None:
    """Candidates into the store, one rollout per candidate slot k (its candidates of every
    turn); each slot also gets the greedy path's outcome, the episode all K belong to."""
    for tree in trees:
        qid = tree.question.id
        correct, reward = score_episode(tree.answer, tree.format_ok, tree.question.answer,
                                        verifier, cfg.rewards.planner,
                                        question=tree.question.question)
        for k in range(cfg.k):
            attempt = store.begin_attempt(round_id, qid, k)
            if attempt is None:  # completed before a crash
                continue
            trajs = [t.model_copy(update={"attempt": attempt})
                     for t in tree.candidates if t.rollout == k]
            store.write_planner_outcomes(round_id, [PlannerOutcomeIn(
                query_id=qid, rollout=k, attempt=attempt, format_ok=tree.format_ok,
                correct=correct, reward=reward)])
            store.ingest_trajectories(trajs)
            store.complete_rollout(round_id, qid, k, attempt)


def train_tree_models(models: dict, roles: dict[str, str], store, round_id: str,
                      cfg: RunConfig, round_index: int) -> dict[str, float]:
    """Every model's share of a tree round, in this process: :func:`train_tree_model` on its
    roles' candidates (``roles``: role -> model), read back from the store, and its group
    statistics published. The models' metrics, merged."""
    metrics: dict[str, float] = {}
    for lm in models.values():
        own = [r for r, m in roles.items() if m == lm.name]
        model_metrics, stats = train_tree_model(
            lm, own, store.round_trajectories(round_id, lm.name), cfg, round_index)
        publish_stats(store, round_id, lm.name, stats)
        metrics.update(model_metrics)
    return metrics


def run_at_grpo_round(system, store, run_id: str, round_index: int, pool: list) -> dict:
    """One AT-GRPO round (the ``at_grpo`` branch of ``mgrpo.training.loop``): trees ->
    store -> each model's trainer reads its candidates back, publishes its group statistics
    and updates -> checkpoint."""
    import time

    cfg = system.cfg
    round_id = round_id_of(run_id, round_index)
    questions = sample_questions(pool, cfg.queries_per_round, cfg.seed, round_index)
    open_round(store, cfg, run_id, round_index, [q.id for q in questions])
    t0 = time.perf_counter()
    trees = TreeSampler(system.runtimes, system.cards(), cfg, system.judge).run(
        round_id, questions, tree_seed(cfg, round_index))
    t1 = time.perf_counter()
    errors_before = getattr(system.verifier, "errors", 0)
    ingest_trees(store, round_id, trees, cfg, system.verifier)
    verifier_errors = getattr(system.verifier, "errors", 0) - errors_before
    t2 = time.perf_counter()
    store.set_round_status(round_id, "training")
    metrics = train_tree_models(system.models, cfg.agents, store, round_id, cfg, round_index)
    t3 = time.perf_counter()
    save_state(system, round_index)
    n = max(len(trees), 1)
    correct = [float(system.verifier.score(t.answer or "", t.question.answer,
                                           t.question.question)) * t.format_ok for t in trees]
    generated = sum(sum(t.response_mask) for tree in trees for t in tree.candidates)
    metrics.update({"planner/accuracy": sum(correct) / n,
                    "rollout/generated_tokens": float(generated),  # every candidate's action
                    "planner/format_valid": sum(t.format_ok for t in trees) / n,
                    "planner/verifier_errors": float(verifier_errors),
                    "time/rollout_s": t1 - t0, "time/ingest_s": t2 - t1,
                    "time/update_s": t3 - t2, "time/weight_sync_s": time.perf_counter() - t3})
    store.record_metrics(run_id, round_id, metrics)
    store.set_round_status(round_id, "done")
    return metrics
