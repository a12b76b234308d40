"""Start, inspect and cancel distributed training rounds (docs/services.md, 'One round
(distributed)', step 1).

:func:`start_round` picks B questions (a pure function of (seed, round index), as in
embedded mode), writes the queries, the round and its B*K pending rollouts in the store,
then enqueues one ``EpisodeTask`` per rollout on ``planner.episodes`` and wakes each trained
model's trainer with a ``RoundCommand``, all in one ``publish_many`` (one wait for the
broker's confirms; a batch it did not confirm raises rather than being lost silently). The
round's config (the run config plus ``trained_models``) is stored with it, so every worker
and trainer reads the SAME settings for that round. The round ends when every trained model
has published its group statistics (the trainers set ``done``); a round that trains no model
(a curriculum stage's difficulty filter) ends when its rollouts are complete (the planner
worker sets ``done``).

The round is an outbox: it is created with ``published`` false and marked published once the
broker has confirmed all its tasks. A process killed in between leaves a running round with
no tasks; :func:`publish_unpublished_rounds` (the control worker runs it at start and every
:data:`PUBLISH_SWEEP_S`) publishes such a round's tasks again. That is idempotent by task key:
a task that did reach the broker has the same idempotency key the second time, so its worker
acks the copy without playing it again.

What this module does NOT do: play episodes or train (workers and trainers do).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

from mgrpo.algo.staleness import Admission
from mgrpo.bus.messages import EpisodeTask, RoundCommand
from mgrpo.envs import load_benchmark
from mgrpo.services.context import Queues, round_spec
from mgrpo.services.team import is_team, team_queries
from mgrpo.store.errors import RunBusy
from mgrpo.store.models import utcnow
from mgrpo.store.records import TERMINAL_ROUND_STATUSES, QueryRecord
from mgrpo.training.config import RunConfig
from mgrpo.training.loop import filter_round_id, hard_questions, stage_at
from mgrpo.training.round_spec import RoundSpec
from mgrpo.training.round_store import round_id_of
from mgrpo.training.rounds import sample_questions

log = logging.getLogger(__name__)

# A round unpublished this long after its creation has lost its creator (a publish takes
# well under a second; a broker restart a few): the sweep publishes it.
PUBLISH_GRACE_S = 60.0
PUBLISH_SWEEP_S = 30.0  # how often the control worker sweeps


class RoundConflict(RuntimeError):
    """A round of this run is still in progress."""


class RoundRefused(ValueError):
    """The round request is something distributed mode cannot do, or contradicts the store
    (an ``init_from`` that cannot apply); the API answers 422."""


def check_init_from(store, cfg: RunConfig, run_id: str) -> None:
    """``init_from`` must name ANOTHER run that has checkpoints of every trained model (the
    named version, if any), and applies only before this run has checkpoints of its own."""
    init = cfg.init_from
    if init is None:
        return
    if init.out_dir is not None:
        raise RoundRefused("init_from.out_dir is for embedded runs; the services' runs all "
                           "live under MGRPO_CHECKPOINT_URI: drop out_dir")
    if init.run_id == run_id:
        raise RoundRefused(f"init_from names run {run_id!r} itself; a run continues from its "
                           "own newest checkpoint without init_from")
    own = [c.model for c in store.list_checkpoints(run_id=run_id)]
    if own:
        raise RoundRefused(f"run {run_id!r} has checkpoints already ({sorted(set(own))}); "
                           "init_from only sets where a run starts: start a new run_id")
    for model in cfg.trained_models():
        found = (store.get_checkpoint(model, init.version, run_id=init.run_id)
                 if init.version else store.latest_checkpoint(model, run_id=init.run_id))
        if found is None:
            what = f"v{init.version}" if init.version else "any checkpoint"
            raise RoundRefused(f"init_from: run {init.run_id!r} has no {what} of {model}; "
                               "list them with GET /v1/checkpoints?run_id=" + init.run_id)


class RoundTooBig(RoundRefused):
    """``queries_per_round`` larger than a training pool the run plays (never clamped)."""


def check_round_size(cfg: RunConfig, bench) -> None:
    """:class:`RoundTooBig` unless every stage the run plays holds ``cfg.queries_per_round``
    training questions (``bench``: the benchmark; None for a turn team: its world's tasks).
    ``POST /v1/rounds`` and the control task both check this before a round is created."""
    if bench is None:
        if cfg.queries_per_round > cfg.workflow.train_tasks:
            raise RoundTooBig(f"queries_per_round={cfg.queries_per_round} is larger than the "
                              f"world's training tasks (workflow.train_tasks: "
                              f"{cfg.workflow.train_tasks})")
        return
    for number, stage in played_stages(cfg):
        pool = len(bench.questions("train", stage=stage))
        if cfg.queries_per_round > pool:
            raise RoundTooBig(f"queries_per_round={cfg.queries_per_round} is larger than the "
                              f"training pool of curriculum stage {number} ({pool} questions "
                              f"in {cfg.bench_dir!r}, split train, benchmark stage {stage}); "
                              f"ask for at most {pool}")


def played_stages(cfg: RunConfig) -> list[tuple[int, int | None]]:
    """(1-based stage number, benchmark stage) of every curriculum stage a run can play: each
    with rounds > 0, and the last (distributed runs go on in it past the schedule). Each
    must hold B training questions (the API checks them all before the first round)."""
    last = len(cfg.stages) - 1
    return [(i + 1, s.stage) for i, s in enumerate(cfg.stages) if s.rounds > 0 or i == last]


def start_round(store, bus, cfg: RunConfig, queues: Queues, *, run_id: str | None = None,
                index: int | None = None, questions: list | None = None, bench=None):
    """Create round ``index`` (default: the next) of ``run_id`` and enqueue its episodes.

    The round's questions come from its curriculum stage (``stage_at``). When that stage
    filters by difficulty (``max_success`` < 1) and its filter has not been played yet, the
    FILTER round is created and returned instead (its id ``filter_round_id``, no model
    trains); call again once it is ``done`` to start the training round from the questions
    it kept (``hard_questions``), as embedded mode does at the start of a stage.

    Returns the :class:`~mgrpo.store.records.RoundRecord`. Raises :class:`RoundConflict` if
    a round of the run is not finished (rounds are synchronous, on-policy), unless
    the asynchronous mode admits the new round (:func:`admit`), and
    :class:`RoundRefused` for a config the services cannot run or an ``init_from`` that
    cannot apply (:func:`check_init_from`). The run's workers and trainers use ITS newest
    checkpoints only (versions are per run).
    """
    run_id = run_id or cfg.name
    check_init_from(store, cfg, run_id)
    store.create_run(run_id, run_id, cfg.model_dump(mode="json"))
    existing = store.list_rounds(run_id)
    busy = [r for r in existing if r.status not in TERMINAL_ROUND_STATUSES]
    index = sum(r.index >= 0 for r in existing) if index is None else index
    if busy:
        admit(store, cfg, run_id, index, busy)
    trained = cfg.trained_models()
    if questions is None and is_team(cfg):  # a turn team: the world's training tasks
        questions = team_queries(cfg, index)
    if questions is None:
        if bench is None:
            bench = load_benchmark(cfg.bench_dir)
        stage_index = stage_at(cfg, index)
        stage = cfg.stages[stage_index] if cfg.stages else None
        questions = bench.questions("train", stage=stage.stage if stage else None)
        if stage is not None and stage.max_success < 1.0:
            filtered = _filter_result(store, run_id, stage_index, stage)
            if filtered is None and busy:  # a stage's filter waits for the rounds before it
                raise _busy(run_id, busy)
            if filtered is None:
                return _enqueue(store, bus, cfg, queues, run_id,
                                filter_round_id(run_id, stage_index), -1 - stage_index,
                                questions, stage.filter_samples, trained=[], scored=[],
                                unfinished=busy)
            questions = hard_questions(questions, filtered, stage.max_success)
        questions = sample_questions(questions, cfg.queries_per_round, cfg.seed, index)
    return _enqueue(store, bus, cfg, queues, run_id, round_id_of(run_id, index), index,
                    questions, cfg.k, trained=trained, scored=list(dict.fromkeys(
                        cfg.agents.values())), unfinished=busy)


def _busy(run_id: str, busy: list) -> RoundConflict:
    rid = busy[0].round_id
    return RoundConflict(f"round {rid} of run {run_id!r} is still in progress; wait for it "
                         f"(GET /v1/rounds/{rid}) or cancel it")


def admit(store, cfg: RunConfig, run_id: str, index: int, busy: list) -> None:
    """May training round ``index`` start while the rounds ``busy`` are unfinished? Only in
    the asynchronous mode (``max_staleness`` > 0), behind every unfinished round, and once
    every trained model's newest checkpoint of the run is recent enough that the round's
    samples stay within the bound (:class:`mgrpo.algo.staleness.Admission`: round r is
    trained at version r, so it needs version r - N; workers refresh to the newest
    checkpoint before every batch). Raises :class:`RoundConflict` otherwise."""
    bounds = {m: cfg.staleness(m) for m in cfg.trained_models()}
    if not any(bounds.values()) or index < 0 or any(r.index < 0 or r.index >= index
                                                    for r in busy):
        raise _busy(run_id, busy)
    admission = Admission(bounds)
    published = {}
    for model in bounds:
        record = store.latest_checkpoint(model, run_id=run_id)
        published[model] = record.version if record is not None else 0
    if not admission.admitted(index, published):
        missing = {m: admission.min_version(m, index) for m in bounds
                   if published[m] < admission.min_version(m, index)}
        raise RoundConflict(
            f"round {index} of run {run_id!r} may start once versions {missing} are "
            f"published (max_staleness {bounds}; newest {published}); "
            f"{len(busy)} round(s) still in progress, e.g. {busy[0].round_id}")


def _filter_result(store, run_id: str, stage_index: int, stage) -> list | None:
    """(query id, correct) per rollout of the stage's finished filter round; None if it was
    never started."""
    record = store.get_round(filter_round_id(run_id, stage_index))
    if record is None:
        return None
    if record.status != "done":
        raise RoundRefused(f"the difficulty filter of stage {stage_index} "
                           f"({record.round_id}) ended {record.status!r}; its questions "
                           "cannot be chosen (start a new run id)")
    return [(o.query_id, o.correct) for o in store.read_planner_outcomes(record.round_id)]


def _enqueue(store, bus, cfg: RunConfig, queues: Queues, run_id: str, round_id: str,
             index: int, questions: list, k: int, trained: list[str], scored: list[str],
             unfinished: list):
    """Create the round, then publish its tasks: only the request that created it does
    (a concurrent start of the same run gets :class:`RoundConflict`, and never touches the
    status of a round it did not create). A publish the broker refuses fails the round with
    the reason, so the run is not left with a 'running' round that has no tasks."""
    spec = RoundSpec.of(cfg, trained, scored)
    config = spec.stored()
    # the queries, the round (already 'running') and its rollouts: one transaction, with the
    # check that no other round of the run started meanwhile (under the run's row lock)
    try:
        created = store.create_round(
            run_id, round_id, index, [q.id for q in questions], k, config,
            queries=[QueryRecord(query_id=q.id, question=q.question, answer=q.answer,
                                 meta={"kind": q.kind, "stage": q.stage})
                     for q in questions],
            running=True, unfinished=[r.round_id for r in unfinished], published=False)
    except RunBusy as error:
        raise _busy(run_id, [store.get_round(error.round_ids[0])]) from error
    if not created:
        raise RoundConflict(f"round {round_id} of run {run_id!r} exists already (started by "
                            f"another request); see GET /v1/rounds/{round_id}")
    tasks = spec.tasks_per_query(index, k)
    try:
        _publish_round(store, bus, queues, run_id, round_id, [q.id for q in questions], tasks,
                       scored)
    except Exception as error:
        with contextlib.suppress(Exception):  # the store down as well: the raise says why
            store.set_round_status(round_id, "failed", only_from=("running",),
                                   error=f"its tasks were not published: "
                                         f"{type(error).__name__}: {error}"[:2000])
        raise
    return store.get_round(round_id)


def _publish_round(store, bus, queues: Queues, run_id: str, round_id: str,
                   query_ids: list[str], tasks: int, scored: list[str]) -> None:
    """Publish a round's episode tasks and its trainers' wake-ups, then mark it published.
    One send (a planner worker may start once it holds them all), one confirm wait."""
    bus.publish_many([(queues.episodes, EpisodeTask(
        run_id=run_id, round_id=round_id, query_id=query_id, rollout=rollout, group=round_id,
        group_size=len(query_ids) * tasks)) for query_id in query_ids
        for rollout in range(tasks)]
        + [(queues.trainer(model), RoundCommand(command="train", run_id=run_id,
                                                round_id=round_id, model=model))
           for model in scored])
    store.mark_round_published(round_id)


def publish_unpublished_rounds(store, bus, queues: Queues, default: RunConfig | None = None,
                               grace_s: float = PUBLISH_GRACE_S) -> list[str]:
    """Publish the tasks of every running round created over ``grace_s`` ago and never
    marked published (see the module docstring); returns their ids. Idempotent."""
    done = []
    for record in store.unpublished_rounds(utcnow() - timedelta(seconds=grace_s)):
        spec = round_spec(record, default)
        query_ids = list(dict.fromkeys(r.query_id for r in store.rollouts(record.round_id)))
        tasks = spec.tasks_per_query(record.index, record.k)
        log.warning("round %s was created but its tasks were never all published (its "
                    "creator stopped); publishing them now", record.round_id)
        _publish_round(store, bus, queues, record.run_id, record.round_id, query_ids, tasks,
                       spec.scored_models)
        done.append(record.round_id)
    return done


def cancel_round(store, round_id: str):
    """Mark a round cancelled; workers skip its remaining tasks, trainers stop waiting.
    Returns the record, or None if there is no such round."""
    record = store.get_round(round_id)
    if record is None:
        return None
    if record.status not in TERMINAL_ROUND_STATUSES:
        store.set_round_status(round_id, "cancelled")
    return store.get_round(round_id)


def round_summary(store, round_id: str, default: RunConfig | None = None) -> dict | None:
    """Status, progress, published models, metrics and trajectory counts of one round
    (``default``: the config of a round stored without one)."""
    record = store.get_round(round_id)
    if record is None:
        return None
    progress = store.round_progress(round_id)
    spec = round_spec(record, default)
    trained, scored = (spec.trained_models, spec.scored_models) if spec else ([], [])
    return {
        "round_id": record.round_id, "run_id": record.run_id, "index": record.index,
        "k": record.k, "status": record.status, "error": record.error,
        "created_at": record.created_at, "started_at": record.started_at,
        "finished_at": record.finished_at,
        "rollouts": {"total": progress.total, "completed": progress.completed},
        "trained_models": trained,
        "published_models": sorted(store.published_models(round_id)),
        "trajectories": {m: store.count_round_trajectories(round_id, m)
                         for m in scored},
        "metrics": store.metrics(record.run_id, round_id).get(round_id, {}),
    }
