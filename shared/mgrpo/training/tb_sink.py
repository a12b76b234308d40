"""TensorBoard events of the distributed trainers: one log dir per run and model.

In embedded mode ``MetricsLogger`` writes ``<out_dir>/tensorboard``. A distributed trainer
(``mgrpo serve trainer``) writes only the stats store unless ``MGRPO_TENSORBOARD_DIR`` is
set (and the run config's ``report_to`` keeps ``tensorboard``, its default); then each
trained round's metrics (what ``train_round`` records: the ``{role}/...`` reward/advantage
keys and the ``{model}/...`` loss keys) also go to
``<dir>/<run_id>/<model>/`` at step = round index (with ``log_completions`` of its
trajectories, decoded, in the text tab), so ``tensorboard --logdir <dir>`` shows
every run and model side by side, and trainers of different models never share a file.

What this module does NOT do: read events back (TensorBoard does), or log rollout-side keys
(the trainers never see them; docs/metrics.md).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path


class TensorBoardSink:
    def __init__(self, root: str | Path, model: str) -> None:
        self.root, self.model = Path(root), model
        self._writers: dict[str, object] = {}
        self._lock = threading.Lock()

    def log_dir(self, run_id: str) -> Path:
        return self.root / run_id / self.model

    def log(self, run_id: str, step: int, metrics: dict[str, float]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        with self._lock:
            writer = self._writers.get(run_id)
            if writer is None:
                writer = self._writers[run_id] = SummaryWriter(str(self.log_dir(run_id)))
            for key, value in sorted(metrics.items()):
                if math.isfinite(value):
                    writer.add_scalar(key, value, step)
            writer.flush()

    def log_completions(self, run_id: str, step: int, records: list[dict]) -> None:
        """A round's sampled completions (``mgrpo.training.episode_text`` records) to the
        text tab, tag ``completions``, one preformatted block each."""
        if not records:
            return
        from torch.utils.tensorboard import SummaryWriter

        with self._lock:
            writer = self._writers.get(run_id)
            if writer is None:
                writer = self._writers[run_id] = SummaryWriter(str(self.log_dir(run_id)))
            writer.add_text("completions", "\n\n".join(
                "    " + r["text"].replace("\n", "\n    ") for r in records), step)
            writer.flush()

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
