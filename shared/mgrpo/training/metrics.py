"""Where round metrics go besides the stats store: a CSV, TensorBoard and Weights & Biases
(the run config's ``report_to``), and stderr.

``metrics.csv`` is long-format (round, key, value) so new keys never break the header;
``mgrpo plot RUN`` reads it. Keys follow ``"{agent}/{quantity}"`` (docs/metrics.md).

On stderr, whatever it is (a terminal, a pipe, a file under ``nohup``): one line per round
(every ``log_every`` rounds, and the last) and per evaluation, in the format of
docs/metrics.md ("Log lines"), and the warnings of :class:`~mgrpo.training.watch.RunWatch`
(never silenced); a progress bar besides on a terminal only. A few episodes per round, as
people read them, go to ``completions.jsonl``, TensorBoard's text tab and a W&B table.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from mgrpo.progress import format_line, log_line, progress_bar
from mgrpo.training.wandb_sink import WandbSink
from mgrpo.training.watch import RunWatch

# What a round's log line shows, in this order: the training episodes' accuracy and format
# validity, then each role's reward, share of zero-variance groups and each model's grad norm.
LINE_KEYS = ("planner/accuracy", "planner/format_valid")
COMPLETIONS_FILE = "completions.jsonl"
# a completions table's columns (W&B), from each record of mgrpo.training.episode_text
COMPLETION_COLUMNS = ("round", "query_id", "rollout", "reward", "correct", "format_ok", "text")
LINE_SUFFIXES = ("/reward_mean", "/frac_reward_zero_std", "/grad_norm")


def round_line_values(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a round's log line shows (docs/metrics.md, "Log lines")."""
    out = {k: metrics[k] for k in LINE_KEYS if k in metrics}
    for suffix in LINE_SUFFIXES:
        keys = sorted((k for k in metrics if k.endswith(suffix)),
                      key=lambda k: (not k.startswith("planner/"), k))
        out.update({k: metrics[k] for k in keys})
    return out


def eval_line_values(metrics: dict[str, float]) -> dict[str, float]:
    """An evaluation's log line: accuracy and format validity per decoding mode."""
    return {f"eval/{mode}/{quantity}": metrics[f"eval/{mode}/{quantity}"]
            for mode in ("sampled", "greedy") for quantity in ("accuracy", "format_valid")
            if f"eval/{mode}/{quantity}" in metrics}


class MetricsLogger:
    def __init__(self, out_dir: Path, enabled: bool = True,
                 report_to: Iterable[str] = ("tensorboard",), run_name: str = "run",
                 config: dict | None = None, log_every: int = 1,
                 total_rounds: int | None = None, watch: RunWatch | None = None):
        self.out_dir = out_dir
        self.enabled = enabled  # the progress bar (log lines are not affected)
        self.log_every = log_every
        self.total_rounds = total_rounds
        self.watch = watch
        self._clock = time.perf_counter()
        self.run_name = run_name
        self._wandb = None
        if "wandb" in report_to:  # first: a missing package stops before any file is opened

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
        self._clock = time.perf_counter()
        return iter(self._bar)

    def _lap(self) -> float:
        """Seconds since the previous round or evaluation line (or the start)."""
        now = time.perf_counter()
        seconds, self._clock = now - self._clock, now
        return seconds

    def log_round(self, round_index: int, metrics: dict[str, float],
                  completions: Sequence[dict] = ()) -> None:
        """A round's metrics to every sink, and its log line every ``log_every`` rounds;
        ``completions``: a few of its episodes as readable records (:meth:`log_completions`)."""
        self.log(round_index, metrics)
        self.log_completions(round_index, completions)
        seconds = self._lap()
        count = round_index + 1
        last = count == self.total_rounds
        if self.log_every > 0 and (count % self.log_every == 0 or last):
            total = f"/{self.total_rounds}" if self.total_rounds else ""
            log_line(format_line(f"round {count}{total}", round_line_values(metrics),
                                 seconds))
        if self.watch is not None:
            for warning in self.watch.check(round_index, metrics):
                log_line(warning, warning=True)

    def log_eval(self, step: int, metrics: dict[str, float], label: str,
                 seconds: float | None = None) -> None:
        """An evaluation's metrics at ``step`` (rounds done) to every sink, and its line
        (``seconds``: its duration; default the time since the previous line)."""
        self.log(step, metrics)
        lap = self._lap()
        log_line(format_line(f"eval {label}", eval_line_values(metrics),
                             lap if seconds is None else seconds))

    def log_completions(self, step: int, records: Sequence[dict]) -> None:
        """Episodes as people read them (``mgrpo.training.episode_text`` records): appended
        to ``completions.jsonl`` (one line each, with ``round``), TensorBoard's text tab
        (``completions``, one preformatted block each) and a W&B table (``completions``)."""
        if not records:
            return
        rows = [{"round": step, **record} for record in records]
        with (self.out_dir / COMPLETIONS_FILE).open("a") as fh:
            fh.writelines(json.dumps(row, default=str) + "\n" for row in rows)
        if self._tb is not None:
            self._tb.add_text("completions", "\n\n".join(
                "    " + record["text"].replace("\n", "\n    ") for record in records), step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log_table(self.run_name, step, "completions", COMPLETION_COLUMNS,
                                  [[row.get(c) for c in COMPLETION_COLUMNS] for row in rows])

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
