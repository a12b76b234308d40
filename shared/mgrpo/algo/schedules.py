"""Learning-rate schedules with linear warm-up, as Hugging Face's ``get_scheduler`` computes
them (``transformers.optimization``: ``constant_with_warmup``, ``linear``, ``cosine``), so a
TRL or verl user gets the learning rates they expect.

For optimizer step ``s`` (0-based: the rate used by the ``s``-th ``optimizer.step()``),
warm-up ``W`` steps and ``N`` steps in all:

    warm-up (s < W):  lr * s / max(1, W)                      (0 at the very first step)
    constant:         lr
    linear:           lr * max(0, (N - s) / max(1, N - W))
    cosine:           lr * 0.5 * (1 + cos(pi * min(1, (s - W) / max(1, N - W))))

(Past N the cosine stays at 0; Hugging Face's rises again there.)

What this module does NOT do: hold state or touch an optimizer (the trainer sets each step's
rate from the optimizer's own step count, so a resumed run continues the schedule).
"""

from __future__ import annotations

import math
from typing import Literal

LRSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")


def lr_at(step: int, base_lr: float, schedule: LRSchedule = "constant", warmup_steps: int = 0,
          total_steps: int | None = None) -> float:
    """The learning rate of optimizer step ``step`` (0-based). ``total_steps`` (N) is needed
    by linear and cosine; past N they give 0."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_schedule {schedule!r}; valid: {list(LR_SCHEDULES)}")
    if step < warmup_steps:
        return base_lr * step / max(1, warmup_steps)
    if schedule == "constant":
        return base_lr
    if total_steps is None:
        raise ValueError(f"lr_schedule={schedule} needs total_steps (the run's optimizer steps)")
    span = max(1, total_steps - warmup_steps)
    if schedule == "linear":
        return base_lr * max(0.0, (total_steps - step) / span)
    progress = min(1.0, (step - warmup_steps) / span)
    return base_lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
