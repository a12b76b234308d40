"""The embedded training loop: rounds of collect -> score -> store -> train -> checkpoint.

Every round goes through the stats store exactly as in distributed mode: the planner side
writes its outcomes, every trajectory is ingested, and each model's trainer reads back ONLY
its own model's trajectories and the planner outcomes, publishes its group statistics, and
updates. State needed to resume (last complete round, weights, optimizer moments) is
checkpointed atomically after each round; every random choice is a pure function of
(seed, round), so a resumed run repeats what the uninterrupted run would have done.

:func:`run_training` holds the run folder and plays the run of ``cfg``'s workflow with the
runner registered for it (:mod:`mgrpo.training.runners`). The ``hierarchy`` workflow's run
is :class:`~mgrpo.training.hierarchy_run.HierarchyPlan` played by the round loop every
workflow shares (:func:`mgrpo.training.run_rounds.run_rounds`); a turn team's:
:mod:`mgrpo.training.team_round`. A run's folders, state file, resume and fresh start:
:mod:`mgrpo.training.run_state`; its stages and their difficulty-filtered pools:
:mod:`mgrpo.training.stages` (re-exported here, with the hierarchy's rounds).
"""

from __future__ import annotations

from pathlib import Path

from mgrpo.training.config import RunConfig
from mgrpo.training.hierarchy_run import (  # noqa: F401 - re-exported
    HierarchyPlan,
    run_hierarchy,
    run_round,
)
from mgrpo.training.round_store import (  # noqa: F401 - re-exported
    expected_roles,
    finish_round,
    ingest_episodes,
    open_round,
    publish_stats,
    round_id_of,
    staleness_metrics,
    take_completions,
)
from mgrpo.training.run_lock import own_run_folder
from mgrpo.training.run_rounds import RunResult
from mgrpo.training.run_state import (  # noqa: F401 - re-exported
    STATE_FILE,
    checkpoint_root,
    clean_uncommitted,
    save_state,
    start_weights,
    sync_sampler,
    write_json_atomic,
)
from mgrpo.training.runners import train_run
from mgrpo.training.stages import (  # noqa: F401 - re-exported
    clear_pools,
    filter_round_id,
    hard_questions,
    stage_at,
    stage_pool,
    stage_schedule,
)


def run_training(cfg: RunConfig, resume: bool = False, progress: bool = True,
                 stop_after: int | None = None, log_every: int = 1) -> RunResult:
    """Train per ``cfg`` in this process. ``stop_after`` ends early (tests of resume).
    ``progress``: the progress bar (on a terminal); ``log_every``: a log line on stderr
    every N rounds (and the last), whatever stderr is (``MGRPO_QUIET=1``: none).

    The run owns ``out_dir`` meanwhile (:mod:`mgrpo.training.run_lock`): a folder another
    live process trains in is refused, and a start that fails before its first round is
    committed leaves the folder as it found it."""
    with own_run_folder(Path(cfg.out_dir)):  # the runner of the run's workflow plays it
        return train_run(cfg, resume, progress, stop_after, log_every)
