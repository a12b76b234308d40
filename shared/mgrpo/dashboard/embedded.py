"""An embedded run's folder as the dashboard reads it: its stats store and run config.

An embedded run (``mgrpo train``/``mgrpo demo``) leaves ``store.db`` (the SQLite stats store:
rounds, metrics, group statistics, trajectories, checkpoints) and ``metrics.csv`` (also the
eval curves) in its ``out_dir``. :func:`open_run_dir` opens that store and reads the config
of its last run. The app that serves them is the planner API's, composed by its caller
(``mgrpo ui``, :func:`mgrpo.cli.ui.ui_app`): this room never builds it.

What this module does NOT do: train, serve, or write to the run's store beyond
``upgrade()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgrpo.store import Store
from mgrpo.training.config import RunConfig
from mgrpo.training.round_spec import RoundSpec


class NotARunDir(ValueError):
    """The folder holds no ``store.db``: not an embedded run's ``out_dir``."""


@dataclass(frozen=True)
class EmbeddedRun:
    """An opened run folder: its store (migrated), the store's URL and the last run's
    config (an empty one when the store holds no run yet)."""

    run_dir: Path
    database_url: str
    store: Store
    cfg: RunConfig


def open_run_dir(run_dir: Path) -> EmbeddedRun:
    """Open the stats store of the embedded run in ``run_dir``; :class:`NotARunDir` when it
    has none."""
    run_dir = Path(run_dir)
    db = run_dir / "store.db"
    if not db.is_file():
        raise NotARunDir(f"{run_dir} has no store.db: pass the out_dir of an embedded run "
                         "(e.g. runs/demo/run), where `mgrpo train` writes store.db and "
                         "metrics.csv")
    url = f"sqlite:///{db.resolve()}"
    store = Store(url)
    store.upgrade()
    runs = store.list_runs()
    stored = RoundSpec.from_stored(runs[-1].config) if runs else None
    cfg = stored.run if stored is not None else RunConfig(models={})
    return EmbeddedRun(run_dir, url, store, cfg)
