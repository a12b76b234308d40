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
from mgrpo.training.evaluate import evaluate, evaluate_both
from mgrpo.training.metrics import MetricsLogger
from mgrpo.training.pipeline import run_async
from mgrpo.training.round_store import (  # noqa: F401 - re-exported
    expected_roles,
    finish_round,
    ingest_episodes,
    open_round,
    publish_stats,
    round_id_of,
    staleness_metrics,
)
from mgrpo.training.rounds import collect, sample_questions
from mgrpo.training.run_state import (  # noqa: F401 - re-exported
    STATE_FILE,
    clean_uncommitted,
    run_dirs,
    save_state,
    start_weights,
    sync_sampler,
    write_json_atomic,
)
from mgrpo.training.stages import (  # noqa: F401 - re-exported
    clear_pools,
    filter_round_id,
    hard_questions,
    stage_at,
    stage_pool,
    stage_schedule,
)
from mgrpo.training.system import System, build_system
from mgrpo.training.tree_round import run_at_grpo_round
from mgrpo.training.watch import RunWatch


@dataclass
class RunResult:
    out_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    wall_s: float = 0.0


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


def run_training(cfg: RunConfig, resume: bool = False, progress: bool = True,
                 stop_after: int | None = None, log_every: int = 1) -> RunResult:
    """Train per ``cfg`` in this process. ``stop_after`` ends early (tests of resume).
    ``progress``: the progress bar (on a terminal); ``log_every``: a log line on stderr
    every N rounds (and the last), whatever stderr is (``MGRPO_QUIET=1``: none).

    The run owns ``out_dir`` meanwhile (:mod:`mgrpo.training.run_lock`): a folder another
    live process trains in is refused, and a start that fails before its first round is
    committed leaves the folder as it found it."""
    from mgrpo.training.run_lock import own_run_folder

    with own_run_folder(Path(cfg.out_dir)):  # the run's workflow trains it (mgrpo.workflows)
        return cfg.flow.train(cfg, resume, progress, stop_after, log_every)


def run_hierarchy(cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
                  log_every: int) -> RunResult:
    """The ``hierarchy`` workflow's run: a planner and its sub-agents on the benchmark."""
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
        result.before = evaluate_both(system, test, logger, "before", step=0)
    if any(cfg.staleness(m) > 0 for m in cfg.trained_models()):  # cfg.algo.asynchronous
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
        # tree sampling, groups (query, agent, turn); else episodes
        round_fn = run_at_grpo_round if cfg.algo.tree else run_round
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
        result.after = evaluate_both(system, test, logger, "after", step=len(schedule))
    result.wall_s = time.perf_counter() - started
    logger.close()
    return result
