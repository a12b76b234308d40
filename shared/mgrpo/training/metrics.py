"""Where round metrics go besides the stats store: a CSV, TensorBoard and Weights & Biases
(the run config's ``report_to``), and the terminal.

``metrics.csv`` is long-format (round, key, value) so new keys never break the header;
``mgrpo plot RUN`` reads it. Keys follow ``"{agent}/{quantity}"`` (docs/metrics.md).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm.auto import tqdm

from mgrpo.progress import progress_bar


class MetricsLogger:
    def __init__(self, out_dir: Path, enabled: bool = True,
                 report_to: Iterable[str] = ("tensorboard",), run_name: str = "run",
                 config: dict | None = None):
        self.out_dir = out_dir
        self.enabled = enabled
        self.run_name = run_name
        self._wandb = None
        if "wandb" in report_to:  # first: a missing package stops before any file is opened
            from mgrpo.training.wandb_sink import WandbSink

            self._wandb = WandbSink(directory=out_dir, config=config)
        self._csv_path = out_dir / "metrics.csv"
        new = not self._csv_path.exists()
        self._csv = self._csv_path.open("a", newline="")
        self._writer = csv.writer(self._csv)
        if new:
            self._writer.writerow(["round", "key", "value"])
        self._tb = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(out_dir / "tensorboard"))
        self._bar = None

    def progress(self, items: Iterable, desc: str) -> Iterator:
        items = list(items)
        self._bar = progress_bar(items, desc=desc, enabled=self.enabled)
        return iter(self._bar)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in sorted(metrics.items()):
            self._writer.writerow([step, key, f"{value:.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(key, value, step)
        self._csv.flush()
        if self._wandb is not None:
            self._wandb.log(self.run_name, step, metrics)
        if self._bar is not None:
            shown = {k.split("/", 1)[-1][:10]: round(v, 3) for k, v in metrics.items()
                     if k in ("planner/accuracy", "planner/reward_mean",
                              "eval/greedy/accuracy")}
            self._bar.set_postfix(shown)

    def note(self, tag: str, metrics: dict[str, float]) -> None:
        if self.enabled:
            tqdm.write(f"[{tag}] " + json.dumps({k: round(v, 4) for k, v in metrics.items()
                                                  if "accuracy" in k and "_" not in
                                                  k.rsplit("/", 1)[-1]}))

    def close(self) -> None:
        self._csv.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv -> {key: [(round, value), ...]} (the last value wins per round)."""
    series: dict[str, dict[int, float]] = {}
    with (run_dir / "metrics.csv").open() as fh:
        for row in csv.DictReader(fh):
            series.setdefault(row["key"], {})[int(row["round"])] = float(row["value"])
    return {k: sorted(v.items()) for k, v in series.items()}
