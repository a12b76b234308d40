"""Weights & Biases sink: optional, off by default (run config ``report_to: [tensorboard,
wandb]``).

It logs what the TensorBoard sink logs, at the same steps: in embedded mode every
``MetricsLogger.log`` (round metrics and evals, step = round index) into one W&B run named
after the run; in distributed mode each trainer's recorded round metrics into one W&B run per
(run id, model), named ``<run_id>-<model>`` and grouped by run id. Non-finite values are left
out, as the trainers' TensorBoard sink does.

W&B is configured by its own environment variables: ``WANDB_PROJECT`` (default ``mgrpo``),
``WANDB_MODE`` (``offline`` writes local run folders and needs no network or account; sync
them later with ``wandb sync``), ``WANDB_DIR`` (embedded default: the run's out_dir),
``WANDB_API_KEY``, ``WANDB_ENTITY``. The ``wandb`` package is not a dependency: ``pip
install 'mgrpo[wandb]'`` (``make wandb-venv`` here).

Each round also logs a ``completions`` table: embedded, a few episodes as text
(``MetricsLogger.log_completions``); a trainer, a few of its model's trajectories, decoded.

What it does NOT do: resume a W&B run (a resumed or restarted process starts a new one),
log rollout-side keys in distributed mode (the trainers never see them), artifacts or traces.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path

INSTALL_HINT = ("report_to includes wandb but the wandb package is not installed: pip install "
                "'mgrpo[wandb]' (wandb==0.31.0), or drop wandb from report_to")


def import_wandb():
    """The ``wandb`` module, or an ImportError of one line that says how to install it."""
    try:
        import wandb
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return wandb


def finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in sorted(metrics.items()) if math.isfinite(v)}


class WandbSink:
    """One W&B run per key (embedded: the run name; distributed: the run id), opened on its
    first ``log``. ``model`` set: names runs ``<run_id>-<model>`` (a trainer's sink)."""

    def __init__(self, model: str | None = None, directory: str | Path | None = None,
                 config: dict | None = None) -> None:
        self._wandb = import_wandb()
        self.model = model
        self.directory = os.environ.get("WANDB_DIR") or (str(directory) if directory else None)
        self.config = config
        self.project = os.environ.get("WANDB_PROJECT", "mgrpo")
        self._runs: dict[str, object] = {}
        self._lock = threading.Lock()

    def _run(self, run_id: str):
        run = self._runs.get(run_id)
        if run is None:
            name = f"{run_id}-{self.model}" if self.model else run_id
            if self.directory:
                Path(self.directory).mkdir(parents=True, exist_ok=True)
            run = self._runs[run_id] = self._wandb.init(
                project=self.project, name=name, group=run_id,
                job_type=f"trainer-{self.model}" if self.model else "train",
                dir=self.directory, config=self.config, reinit="create_new")
        return run

    def log(self, run_id: str, step: int, metrics: dict[str, float]) -> None:
        values = finite(metrics)
        if not values:
            return
        with self._lock:
            self._run(run_id).log(values, step=step)

    def log_table(self, run_id: str, step: int, key: str, columns: Sequence[str],
                  rows: list[list]) -> None:
        """A table (``wandb.Table``) under ``key`` at ``step``: the round's completions."""
        if not rows:
            return
        with self._lock:
            table = self._wandb.Table(columns=list(columns), data=rows)
            self._run(run_id).log({key: table}, step=step)

    def log_completions(self, run_id: str, step: int, records: list[dict]) -> None:
        """A distributed trainer's sampled completions as a ``completions`` table."""
        columns = ("round", "query_id", "rollout", "agent", "format_ok", "text")
        self.log_table(run_id, step, "completions", columns,
                       [[step, *(r.get(c) for c in columns[1:])] for r in records])

    def run_dir(self, run_id: str) -> Path | None:
        """The local folder of ``run_id``'s W&B run (its ``files/`` parent), once opened."""
        run = self._runs.get(run_id)
        return Path(run.dir).parent if run is not None else None

    def close(self) -> None:
        with self._lock:
            for run in self._runs.values():
                run.finish()
            self._runs.clear()
