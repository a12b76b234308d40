"""Start, inspect and cancel distributed training rounds (SPEC 2.2 step 1).

:func:`start_round` picks B questions (a pure function of (seed, round index), as in
embedded mode), writes the queries, the round and its B*K pending rollouts in the store,
then enqueues one ``EpisodeTask`` per rollout on ``planner.episodes`` and wakes each trained
model's trainer with a ``RoundCommand``. The round's config (the run config plus
``trained_models``) is stored with it, so every worker and trainer reads the SAME settings
for that round. The round ends when every trained model has published its group statistics
(the trainers set ``done``).

What this module does NOT do: play episodes or train (workers and trainers do).
"""

from __future__ import annotations

from mgrpo.bus.messages import EpisodeTask, RoundCommand
from mgrpo.services.context import Queues
from mgrpo.store.records import TERMINAL_ROUND_STATUSES, QueryRecord
from mgrpo.training.config import RunConfig
from mgrpo.training.rounds import sample_questions


class RoundConflict(RuntimeError):
    """A round of this run is still in progress."""


def round_id_of(run_id: str, index: int) -> str:
    return f"{run_id}-r{index:04d}"


def start_round(store, bus, cfg: RunConfig, queues: Queues, *, run_id: str | None = None,
                index: int | None = None, questions: list | None = None, bench=None):
    """Create round ``index`` (default: the next) of ``run_id`` and enqueue its episodes.

    Returns the :class:`~mgrpo.store.records.RoundRecord`. Raises :class:`RoundConflict` if
    a round of the run is not finished (rounds are synchronous, on-policy: SPEC 2.2).
    """
    run_id = run_id or cfg.name
    store.create_run(run_id, run_id, cfg.model_dump(mode="json"))
    existing = store.list_rounds(run_id)
    busy = [r.round_id for r in existing if r.status not in TERMINAL_ROUND_STATUSES]
    if busy:
        raise RoundConflict(f"round {busy[0]} of run {run_id!r} is still in progress; wait "
                            f"for it (GET /v1/rounds/{busy[0]}) or cancel it")
    index = len(existing) if index is None else index
    if questions is None:
        if bench is None:
            from mgrpo.envs import load_benchmark

            bench = load_benchmark(cfg.bench_dir)
        stage = cfg.stages[0].stage if cfg.stages else None
        questions = sample_questions(bench.questions("train", stage=stage),
                                     cfg.queries_per_round, cfg.seed, index)
    store.upsert_queries([QueryRecord(query_id=q.id, question=q.question, answer=q.answer,
                                      meta={"kind": q.kind, "stage": q.stage})
                          for q in questions])
    round_id = round_id_of(run_id, index)
    trained = cfg.trained_models()
    config = {**cfg.model_dump(mode="json"), "trained_models": trained}
    store.create_round(run_id, round_id, index, [q.id for q in questions], cfg.k, config)
    store.set_round_status(round_id, "running")
    for q in questions:
        for rollout in range(cfg.k):
            bus.publish(queues.episodes, EpisodeTask(run_id=run_id, round_id=round_id,
                                                     query_id=q.id, rollout=rollout))
    for model in trained:
        bus.publish(queues.trainer(model), RoundCommand(command="train", run_id=run_id,
                                                        round_id=round_id, model=model))
    return store.get_round(round_id)


def cancel_round(store, round_id: str):
    """Mark a round cancelled; workers skip its remaining tasks, trainers stop waiting.
    Returns the record, or None if there is no such round."""
    record = store.get_round(round_id)
    if record is None:
        return None
    if record.status not in TERMINAL_ROUND_STATUSES:
        store.set_round_status(round_id, "cancelled")
    return store.get_round(round_id)


def round_summary(store, round_id: str) -> dict | None:
    """Status, progress, published models, metrics and trajectory counts of one round."""
    record = store.get_round(round_id)
    if record is None:
        return None
    progress = store.round_progress(round_id)
    trained = record.config.get("trained_models", [])
    return {
        "round_id": record.round_id, "run_id": record.run_id, "index": record.index,
        "k": record.k, "status": record.status, "error": record.error,
        "created_at": record.created_at, "started_at": record.started_at,
        "finished_at": record.finished_at,
        "rollouts": {"total": progress.total, "completed": progress.completed},
        "trained_models": trained,
        "published_models": sorted(store.published_models(round_id)),
        "trajectories": {m: store.count_round_trajectories(round_id, m) for m in trained},
        "metrics": store.metrics(record.run_id, round_id).get(round_id, {}),
    }
