"""The in-process run that every built-in workflow's runner shares: :func:`run_rounds`.

It opens the run (its metrics logger, its SQLite stats store under ``out_dir``, the weights
to start or resume from), evaluates before the first round, plays the rounds of the stage
schedule one by one, and evaluates after the last. What a round plays and how the run is
evaluated belong to the workflow's :class:`RoundPlan`
(``mgrpo.training.hierarchy_run.HierarchyPlan``, ``mgrpo.training.team_round.TeamPlan``).

What this module does not do: hold the run folder (``mgrpo.training.loop.run_training`` does)
or pick the workflow's runner (``mgrpo.training.runners``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgrpo.store import Store
from mgrpo.training.config import RunConfig
from mgrpo.training.metrics import MetricsLogger
from mgrpo.training.run_state import start_weights
from mgrpo.training.stages import stage_schedule
from mgrpo.training.watch import RunWatch


@dataclass
class RunResult:
    out_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    wall_s: float = 0.0


class RoundPlan:
    """What one workflow plays in :func:`run_rounds`. ``system`` is built by the plan's
    constructor; ``prepare`` runs once the weights are loaded."""

    system: Any

    def prepare(self, done: int) -> None:
        """The run's task pools and held-out set; ``done``: rounds already trained."""
        raise NotImplementedError

    def evaluate_before(self, logger: MetricsLogger) -> dict[str, float]:
        """The held-out evaluation before the first round (a fresh run only), logged."""
        raise NotImplementedError

    def evaluate_after(self, logger: MetricsLogger, step: int) -> dict[str, float]:
        """The held-out evaluation after the last round, logged at ``step``."""
        raise NotImplementedError

    def play_round(self, store: Store, stage_index: int, round_index: int) -> dict[str, float]:
        """One round: play, store, update every trained model, checkpoint. Its metrics."""
        raise NotImplementedError

    def completions(self, round_index: int) -> list[dict]:
        """A few of round ``round_index``'s episodes as readable records
        (``mgrpo.training.episode_text``), once it is played; none by default."""
        return []

    def after_round(self, logger: MetricsLogger, round_index: int, total: int) -> None:
        """After round ``round_index`` of ``total`` is logged (a periodic evaluation)."""

    def run_pipelined(self, store: Store, logger: MetricsLogger, schedule: list, done: int,
                      stop_after: int | None, result: RunResult) -> bool | None:
        """Play the remaining rounds some other way than one by one (the asynchronous
        pipeline), logging each and calling :meth:`after_round`, and say whether every round
        ran. None (the default) leaves them to :func:`run_rounds`."""
        return None


def run_rounds(cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
               log_every: int, make_plan: Callable[[RunConfig], RoundPlan]) -> RunResult:
    """Train ``cfg`` in this process with the plan ``make_plan(cfg)`` builds (see the module
    docstring). ``stop_after`` ends before that round (no final evaluation)."""
    started = time.perf_counter()
    schedule = stage_schedule(cfg)
    logger = MetricsLogger(Path(cfg.out_dir), enabled=progress, report_to=cfg.report_to,
                           run_name=cfg.name, config=cfg.model_dump(mode="json"),
                           log_every=log_every, total_rounds=len(schedule),
                           watch=RunWatch(dict(cfg.agents), cfg.trained_models()))
    plan = make_plan(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    done = start_weights(plan.system, resume)
    plan.prepare(done)
    result = RunResult(out_dir=Path(cfg.out_dir))
    if done == 0:
        result.before = plan.evaluate_before(logger)
    finished = plan.run_pipelined(store, logger, schedule, done, stop_after, result)
    if finished is None:
        finished = True
        for stage_index, round_index in logger.progress(schedule[done:], desc="rounds"):
            if stop_after is not None and round_index >= stop_after:
                finished = False
                break
            metrics = plan.play_round(store, stage_index, round_index)
            logger.log_round(round_index, metrics, plan.completions(round_index))
            plan.after_round(logger, round_index, len(schedule))
            result.rounds = round_index + 1
    if finished:
        result.after = plan.evaluate_after(logger, len(schedule))
    result.wall_s = time.perf_counter() - started
    logger.close()
    store.close()
    return result
