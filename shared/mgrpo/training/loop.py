"""The embedded training loop: rounds of collect -> score -> store -> train -> checkpoint.

Every round goes through the stats store exactly as in distributed mode: the planner side
writes its outcomes, every trajectory is ingested, and each model's trainer reads back ONLY
its own model's trajectories and the planner outcomes, publishes its group statistics, and
updates. State needed to resume (last complete round, weights, optimizer moments) is
checkpointed atomically after each round; every random choice is a pure function of
(seed, round), so a resumed run repeats what the uninterrupted run would have done.

A run's folders, state file, resume and fresh start: :mod:`mgrpo.training.run_state`; its
stages and their difficulty-filtered pools: :mod:`mgrpo.training.stages` (both re-exported
here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from mgrpo.training.config import RunConfig
from mgrpo.training.evaluate import evaluate
from mgrpo.training.metrics import MetricsLogger
from mgrpo.training.rounds import collect, observed_d, sample_questions, score, train_model
from mgrpo.training.run_state import (  # noqa: F401 - re-exported
    STATE_FILE,
    clean_uncommitted,
    run_dirs,
    save_state,
    start_weights,
    sync_sampler,
    write_json_atomic,
)
from mgrpo.training.scoring import d_counts
from mgrpo.training.stages import (  # noqa: F401 - re-exported
    clear_pools,
    filter_round_id,
    hard_questions,
    stage_at,
    stage_pool,
    stage_schedule,
)
from mgrpo.training.system import System, build_system, out_path
from mgrpo.training.watch import RunWatch


@dataclass
class RunResult:
    out_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    wall_s: float = 0.0


def round_id_of(run_id: str, round_index: int) -> str:
    return f"{run_id}-r{round_index:04d}"


def open_round(store, cfg: RunConfig, run_id: str, round_index: int, questions: list) -> None:
    """Record the round and mark it ``running`` (stamps its start, as the services do): the
    dashboard shows a round in progress as running, not pending."""
    round_id = round_id_of(run_id, round_index)
    if not store.create_round(run_id, round_id, round_index, [q.id for q in questions], cfg.k,
                              cfg.model_dump(mode="json"), running=True):
        store.set_round_status(round_id, "running")  # it existed (a resumed round)


def run_round(system: System, store, run_id: str, round_index: int, pool: list) -> dict:
    """One synchronous round: sample B questions, play them with the current weights, then
    :func:`finish_round`."""
    cfg = system.cfg
    questions = sample_questions(pool, cfg.queries_per_round, cfg.seed, round_index)
    open_round(store, cfg, run_id, round_index, questions)
    t0 = time.perf_counter()
    episodes = collect(system, round_id_of(run_id, round_index), questions, cfg.k, cfg.seed)
    return finish_round(system, store, run_id, round_index, questions, episodes,
                        time.perf_counter() - t0)


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
    """The planner side's hand-off: outcomes and trajectories into the store, then each
    rollout marked complete with the attempt that produced them (SPEC 2.2 step 3)."""
    for ep, outcome in zip(episodes, outcomes, strict=True):
        attempt = store.begin_attempt(round_id, ep.job.question.id, ep.job.rollout)
        if attempt is None:  # completed before a crash: its stored attempt stays the one
            continue
        ep_trajs = [ep.planner, *ep.subagents]
        for traj in ep_trajs:
            traj.attempt = attempt
        store.write_planner_outcomes(round_id, [outcome.model_copy(update={"attempt": attempt})])
        store.ingest_trajectories(ep_trajs)
        store.complete_rollout(round_id, ep.job.question.id, ep.job.rollout, attempt)


def publish_stats(store, round_id: str, model: str, stats) -> None:
    from mgrpo.store import GroupStatIn

    for agent in sorted({s.agent for s in stats}):
        rows = [GroupStatIn(group_key=s.group_key, n=s.n, mean=s.mean, std=s.std)
                for s in stats if s.agent == agent]
        store.publish_group_stats(round_id, model, agent, rows, published_by=f"trainer-{model}")


def _calls(episodes) -> dict[str, float]:
    out: dict[str, float] = {}
    for ep in episodes:
        for role, n in ep.calls_per_role.items():
            out[role] = out.get(role, 0) + n
    return out


def run_training(cfg: RunConfig, resume: bool = False, progress: bool = True,
                 stop_after: int | None = None, log_every: int = 1) -> RunResult:
    """Train per ``cfg`` in this process. ``stop_after`` ends early (tests of resume).
    ``progress``: the progress bar (on a terminal); ``log_every``: a log line on stderr
    every N rounds (and the last), whatever stderr is (``MGRPO_QUIET=1``: none).

    The run owns ``out_dir`` meanwhile (:mod:`mgrpo.training.run_lock`): a folder another
    live process trains in is refused, and a start that fails before its first round is
    committed leaves the folder as it found it."""
    from mgrpo.training.run_lock import own_run_folder

    with own_run_folder(Path(cfg.out_dir)):
        return _run_training(cfg, resume, progress, stop_after, log_every)


def _run_training(cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
                  log_every: int) -> RunResult:
    from mgrpo.store import Store

    started = time.perf_counter()
    schedule = stage_schedule(cfg)
    logger = MetricsLogger(Path(cfg.out_dir), enabled=progress, report_to=cfg.report_to,
                           run_name=cfg.name, config=cfg.model_dump(mode="json"),
                           log_every=log_every, total_rounds=len(schedule),
                           watch=RunWatch(dict(cfg.agents), cfg.trained_models()))
    system = build_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    done = start_weights(system, resume)
    if done == 0:  # new weights: a stored filter pool of an earlier start is not this run's
        clear_pools(cfg, cfg.name)
    result = RunResult(out_dir=Path(cfg.out_dir))
    test = system.bench.questions("test", stage=cfg.eval_stage)[: cfg.eval_questions]
    if done == 0:
        result.before = _eval_both(system, test, logger, "before", step=0)
    if any(cfg.staleness(m) > 0 for m in cfg.trained_models()):  # cfg.algo.asynchronous
        from mgrpo.training.pipeline import run_async

        run_async(system, store, logger, schedule, done, stop_after, result, test)
        result.wall_s = time.perf_counter() - started
        logger.close()
        return result
    pools: dict[int, list] = {}
    for stage_index, round_index in logger.progress(schedule[done:], desc="rounds"):
        if stop_after is not None and round_index >= stop_after:
            break
        if stage_index not in pools:
            pools[stage_index] = stage_pool(system, stage_index, cfg.name)
        if cfg.algo.tree:  # tree sampling, groups (query, agent, turn)
            from mgrpo.training.tree_round import run_at_grpo_round as round_fn
        else:
            round_fn = run_round
        metrics = round_fn(system, store, cfg.name, round_index, pools[stage_index])
        logger.log_round(round_index, metrics)
        # Greedy held-out accuracy every eval_every rounds; the last round's comes from the
        # final evaluation (sampled and greedy) below, not twice.
        if cfg.eval_every and (round_index + 1) % cfg.eval_every == 0 \
                and round_index + 1 < len(schedule):
            logger.log_eval(round_index + 1, evaluate(system, test, greedy=True),
                            f"after round {round_index + 1}/{len(schedule)}")
        result.rounds = round_index + 1
    else:
        result.after = _eval_both(system, test, logger, "after", step=len(schedule))
    result.wall_s = time.perf_counter() - started
    logger.close()
    return result


def _eval_both(system: System, test: list, logger: MetricsLogger, tag: str,
               step: int) -> dict:
    """Sampled and greedy held-out accuracy; logged at ``step`` = rounds of updates so far
    (round metrics at step r describe round r's rollouts, made before its update)."""
    from mgrpo.progress import progress_bar

    started = time.perf_counter()
    out = {}
    questions: dict[str, dict[str, float]] = {}
    with progress_bar(desc=f"eval {tag}", total=2 * len(test), enabled=logger.enabled) as bar:
        for greedy in (False, True):
            per = questions.setdefault("greedy" if greedy else "sampled", {})
            out.update(evaluate(system, test, greedy=greedy, progress=bar.update,
                                per_question=per))
    write_json_atomic(out_path(system.cfg, f"eval_{tag}.json"), out)
    # each question's correctness, for paired comparisons across runs (mgrpo ablate)
    write_json_atomic(out_path(system.cfg, f"eval_{tag}_questions.json"), questions)
    logger.log_eval(step, out, tag, seconds=time.perf_counter() - started)
    return out
