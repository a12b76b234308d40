"""A round's trip through the stats store, shared by every embedded round player: open the
round, then :func:`finish_round` (score, ingest, train every model on what the store gives it
back, publish group statistics, checkpoint, record metrics).

The synchronous loop (``mgrpo.training.loop``), the asynchronous pipeline
(``mgrpo.training.pipeline``) and AT-GRPO's tree round (``mgrpo.training.tree_round``) all
call these; none of them is imported here.

What this module does NOT do: choose or sample questions, play episodes, or evaluate.
"""

from __future__ import annotations

import time

from mgrpo.store import GroupStatIn
from mgrpo.training.config import RunConfig
from mgrpo.training.episode_text import episode_record, sample_records
from mgrpo.training.episodes import mix_seed
from mgrpo.training.rounds import observed_d, score, train_model
from mgrpo.training.run_state import save_state
from mgrpo.training.scoring import d_counts
from mgrpo.training.system import System


def round_id_of(run_id: str, round_index: int) -> str:
    return f"{run_id}-r{round_index:04d}"


def open_round(store, cfg: RunConfig, run_id: str, round_index: int,
               query_ids: list[str]) -> None:
    """Record the round of ``query_ids`` (its questions' or tasks' ids) and mark it
    ``running`` (stamps its start, as the services do): the dashboard shows a round in
    progress as running, not pending."""
    round_id = round_id_of(run_id, round_index)
    if not store.create_round(run_id, round_id, round_index, query_ids, cfg.k,
                              cfg.model_dump(mode="json"), running=True):
        store.set_round_status(round_id, "running")  # it existed (a resumed round)


def finish_round(system: System, store, run_id: str, round_index: int, questions: list,
                 episodes: list, rollout_s: float, admission=None) -> dict:
    """Score and store a round's episodes, train every model on them, checkpoint. With
    ``admission`` (:class:`~mgrpo.algo.staleness.Admission`, the asynchronous mode) each
    model's samples are checked against its staleness bound first."""
    cfg = system.cfg
    round_id = round_id_of(run_id, round_index)
    t1 = time.perf_counter()
    errors_before = getattr(system.verifier, "errors", 0)
    outcomes = score(system, episodes)
    verifier_errors = getattr(system.verifier, "errors", 0) - errors_before
    keep_completions(system, round_index, episodes, outcomes)
    ingest_episodes(store, round_id, episodes, outcomes)
    t2 = time.perf_counter()
    store.set_round_status(round_id, "training")
    metrics: dict[str, float] = {}
    outcome_map = {(o.query_id, o.rollout): o for o in store.read_planner_outcomes(round_id)}
    keys = [(q.id, r) for q in questions for r in range(cfg.k)]
    for lm in system.models.values():
        roles = [r for r, m in cfg.agents.items() if m == lm.name]
        trajs = store.round_trajectories(round_id, lm.name)
        for role in roles:
            if role != "planner":
                store.record_d_counts(role, round_id,
                                      d_counts([t for t in trajs if t.agent == role], keys))
        metrics.update(staleness_metrics(lm, trajs, round_index, admission))
        d_seen = observed_d(store, run_id, roles)
        model_metrics, stats = train_model(lm, roles, trajs, outcome_map, cfg, system.judge,
                                           d_seen, round_index)
        publish_stats(store, round_id, lm.name, stats)
        metrics.update(model_metrics)
    t3 = time.perf_counter()
    save_state(system, round_index)
    t4 = time.perf_counter()
    n = max(len(outcomes), 1)
    generated = sum(sum(t.response_mask) for ep in episodes for t in [ep.planner, *ep.subagents])
    metrics.update({
        "planner/accuracy": sum(o.correct for o in outcomes) / n,
        "planner/format_valid": sum(o.format_ok for o in outcomes) / n,
        "planner/verifier_errors": float(verifier_errors),
        "time/rollout_s": rollout_s, "time/ingest_s": t2 - t1, "time/update_s": t3 - t2,
        "time/weight_sync_s": t4 - t3,
        "rollout/generated_tokens": float(generated),
        "throughput/tokens_per_s": generated / max(rollout_s, 1e-9),
    })
    calls = _calls(episodes)
    for role in sorted(set(calls) | expected_roles(cfg, questions)):  # 0: never called
        metrics[f"{role}/calls_per_episode"] = calls.get(role, 0) / n
    store.record_metrics(run_id, round_id, metrics)
    store.set_round_status(round_id, "done")
    return metrics


def keep_completions(system: System, round_index: int, episodes: list, outcomes: list
                     ) -> None:
    """``log_completions`` of the round's episodes, chosen by the run's seed and the round,
    as readable records, held in ``system.extras["completions"][round_index]`` until the
    round is logged (:func:`take_completions`)."""
    cfg = system.cfg
    pairs = sample_records(list(zip(episodes, outcomes, strict=True)), cfg.log_completions,
                           mix_seed(cfg.seed, "completions", round_index))
    if pairs:
        system.extras.setdefault("completions", {})[round_index] = [
            episode_record(ep, outcome) for ep, outcome in pairs]


def take_completions(system: System, round_index: int) -> list[dict]:
    """The records :func:`keep_completions` held for round ``round_index`` (then gone)."""
    return system.extras.get("completions", {}).pop(round_index, [])


def expected_roles(cfg: RunConfig, questions: list) -> set[str]:
    """The sub-agent roles a round's questions need: those their gold subtasks name, or every
    sub-agent role when no question has subtasks (a benchmark without them). A stage-1 round
    of the demo never needs the coder, so its 0 calls are not news."""
    roles = set(cfg.agents) - {"planner"}
    named = {s.agent for q in questions for s in getattr(q, "subtasks", [])}
    return roles & named if named else roles


def staleness_metrics(lm, trajs, round_index: int, admission=None) -> dict[str, float]:
    """``{model}/staleness_max``: how many updates the trainer is ahead of the oldest weights
    that sampled this round (0 in synchronous rounds); checked against the bound when
    ``admission`` is given."""
    if lm.optimizer is None or not trajs:
        return {}
    versions = [t.weights_version for t in trajs]
    if admission is not None:
        admission.check(lm.name, round_index, versions)
    return {f"{lm.name}/staleness_max": float(lm.version - min(versions))}


def ingest_episodes(store, round_id: str, episodes, outcomes) -> None:
    """The planner side's hand-off: trajectories into the store, then the outcomes and each
    rollout marked complete with the attempt that produced them (docs/services.md, 'One round
    (distributed)', step 4). Three
    transactions for the whole round, as the planner worker's batches: the attempts
    (``begin_attempts``), the trajectories, then outcomes and completions together
    (``finish_episodes``); a rollout completed before a crash keeps its stored attempt."""
    attempts = store.begin_attempts([(round_id, ep.job.question.id, ep.job.rollout)
                                     for ep in episodes])
    kept = [(ep, outcome, attempt) for ep, outcome, attempt
            in zip(episodes, outcomes, attempts, strict=True) if attempt is not None]
    trajs = []
    for ep, _, attempt in kept:
        for traj in (ep.planner, *ep.subagents):
            traj.attempt = attempt
            trajs.append(traj)
    store.ingest_trajectories(trajs)
    store.finish_episodes(round_id, [outcome.model_copy(update={"attempt": attempt})
                                     for _, outcome, attempt in kept], {})


def publish_stats(store, round_id: str, model: str, stats) -> None:
    """Publish ``model``'s group statistics of every role in one store transaction
    (``store.publish_model_stats``): a model is published whole or not at all."""
    rows: dict[str, list] = {}
    for s in stats:
        rows.setdefault(s.agent, []).append(
            GroupStatIn(group_key=s.group_key, n=s.n, mean=s.mean, std=s.std))
    store.publish_model_stats(round_id, model, dict(sorted(rows.items())),
                              published_by=f"trainer-{model}")


def _calls(episodes) -> dict[str, float]:
    out: dict[str, float] = {}
    for ep in episodes:
        for role, n in ep.calls_per_role.items():
            out[role] = out.get(role, 0) + n
    return out
