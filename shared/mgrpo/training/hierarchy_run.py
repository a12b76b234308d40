"""The ``hierarchy`` workflow's run in this process: :class:`HierarchyPlan` (a planner and its
sub-agents on the benchmark, one pool of questions per stage) played by the round loop every
workflow shares (:func:`mgrpo.training.run_rounds.run_rounds`), :func:`run_round`, one
synchronous round of episodes, and :data:`ROUND_PLAYS`, the round player of each algorithm's
``play`` (``episodes``: :func:`run_round`; ``tree``: AT-GRPO's ``run_at_grpo_round``).

Registered for the ``hierarchy`` workflow in :mod:`mgrpo.training.runners`; ``mgrpo train``
reaches it through :func:`mgrpo.training.loop.run_training`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mgrpo.registry import Registry
from mgrpo.training.config import RunConfig
from mgrpo.training.evaluate import evaluate, evaluate_both
from mgrpo.training.metrics import MetricsLogger
from mgrpo.training.pipeline import run_async
from mgrpo.training.round_store import finish_round, open_round, round_id_of, take_completions
from mgrpo.training.rounds import collect, sample_questions
from mgrpo.training.run_rounds import RoundPlan, RunResult, run_rounds
from mgrpo.training.stages import clear_pools, stage_pool
from mgrpo.training.system import System, build_system
from mgrpo.training.tree_round import run_at_grpo_round


def run_round(system: System, store, run_id: str, round_index: int, pool: list) -> dict:
    """One synchronous round: sample B questions, play them with the current weights, then
    :func:`finish_round`."""
    cfg = system.cfg
    questions = sample_questions(pool, cfg.queries_per_round, cfg.seed, round_index)
    open_round(store, cfg, run_id, round_index, [q.id for q in questions])
    t0 = time.perf_counter()
    episodes = collect(system, round_id_of(run_id, round_index), questions, cfg.k, cfg.seed)
    return finish_round(system, store, run_id, round_index, questions, episodes,
                        time.perf_counter() - t0)


RoundPlayer = Callable[[System, object, str, int, list], dict]  # (system, store, run, index, pool)
ROUND_PLAYS: Registry[RoundPlayer] = Registry(
    "round play", hint="the `play` of a registered algorithm; a play of your own: "
    "ROUND_PLAYS.register(name, round_player) in a module named under `plugins:`")
ROUND_PLAYS.register("episodes", run_round)
ROUND_PLAYS.register("tree", run_at_grpo_round)


class HierarchyPlan(RoundPlan):
    """The ``hierarchy`` workflow's rounds: a planner and its sub-agents on the benchmark,
    played by the round player of the algorithm's ``play`` (:data:`ROUND_PLAYS`), one pool
    of questions per stage; held-out accuracy sampled and greedy before and after, greedy
    every ``eval_every`` rounds."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.system = build_system(cfg)
        self.pools: dict[int, list] = {}
        self.test: list = []

    def prepare(self, done: int) -> None:
        cfg = self.cfg
        if done == 0:  # new weights: a stored filter pool of an earlier start is not this run's
            clear_pools(cfg, cfg.name)
        self.test = self.system.bench.questions("test", stage=cfg.eval_stage)[
            : cfg.eval_questions]

    def evaluate_before(self, logger: MetricsLogger) -> dict[str, float]:
        return evaluate_both(self.system, self.test, logger, "before", step=0)

    def evaluate_after(self, logger: MetricsLogger, step: int) -> dict[str, float]:
        return evaluate_both(self.system, self.test, logger, "after", step=step)

    def play_round(self, store, stage_index: int, round_index: int) -> dict[str, float]:
        if stage_index not in self.pools:
            self.pools[stage_index] = stage_pool(self.system, stage_index, self.cfg.name)
        play = ROUND_PLAYS.get(self.cfg.algo.play)
        return play(self.system, store, self.cfg.name, round_index, self.pools[stage_index])

    def completions(self, round_index: int) -> list[dict]:
        return take_completions(self.system, round_index)

    def after_round(self, logger: MetricsLogger, round_index: int, total: int) -> None:
        # Greedy held-out accuracy every eval_every rounds; the last round's comes from the
        # final evaluation (sampled and greedy), not twice.
        if self.cfg.eval_every and (round_index + 1) % self.cfg.eval_every == 0 \
                and round_index + 1 < total:
            logger.log_eval(round_index + 1, evaluate(self.system, self.test, greedy=True),
                            f"after round {round_index + 1}/{total}")

    def run_pipelined(self, store, logger: MetricsLogger, schedule: list, done: int,
                      stop_after: int | None, result: RunResult) -> bool | None:
        cfg = self.cfg
        if not any(cfg.staleness(m) > 0 for m in cfg.trained_models()):  # synchronous
            return None
        return run_async(self.system, store, logger, schedule, done, stop_after, result,
                         self.after_round)


def run_hierarchy(cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
                  log_every: int) -> RunResult:
    """The ``hierarchy`` workflow's run: a planner and its sub-agents on the benchmark."""
    return run_rounds(cfg, resume, progress, stop_after, log_every, HierarchyPlan)
