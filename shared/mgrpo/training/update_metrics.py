"""The metrics of one policy update as true totals over its micro-batches (and ranks).

:func:`mgrpo.algo.policy_loss` reports each micro-batch's own means and maxima. Summed with
the micro-batch's loss share they would be wrong (a count scaled by a share, a maximum
averaged), so here every key is combined by what it is:

- ``num_tokens``: the sum (trained tokens per epoch);
- ``ratio_max``: the maximum;
- ``adv_std``: from the pooled second moment ``E[a^2] - E[a]^2``;
- ``loss``, ``pg_loss``: each optimizer step's loss (micro-batch losses weighted by their
  share of it, the gradient's weighting), averaged over the steps; ``grad_norm`` likewise;
- every other key (clip fractions, ``approx_kl``, ``ratio_mean``, ``adv_mean``, ``kl``,
  ``entropy``): the token-weighted mean over all trained tokens.

Data parallel: :meth:`UpdateTotals.all_reduce` sums (maxima: max) over the ranks. Not here:
the per-agent rollout metrics (``mgrpo.algo.rollout_correction``), which see the whole batch.
"""

from __future__ import annotations

from collections import defaultdict

import torch

MAXIMA = ("ratio_max",)
PER_STEP = ("loss", "pg_loss")


class UpdateTotals:
    def __init__(self) -> None:
        self.weighted: dict[str, float] = defaultdict(float)  # sum of value * tokens
        self.maxima: dict[str, float] = dict.fromkeys(MAXIMA, 0.0)
        self.per_step: dict[str, float] = defaultdict(float)  # sum over steps
        self.tokens = 0.0
        self.steps = 0
        self.epochs = 1

    def add_micro(self, metrics: dict[str, float], share: float, tokens: float) -> None:
        """One micro-batch's :func:`policy_loss` metrics: ``share`` its weight in the step's
        loss, ``tokens`` its trained tokens (0 for a padding pass of a short rank)."""
        for key, value in metrics.items():
            if key in PER_STEP:
                self.per_step[key] += value * share
            elif key in MAXIMA:
                if tokens > 0:
                    self.maxima[key] = max(self.maxima[key], value)
            elif key == "adv_std":
                mean = metrics.get("adv_mean", 0.0)
                self.weighted["adv_sq"] += (value * value + mean * mean) * tokens
            elif key != "num_tokens":
                self.weighted[key] += value * tokens
        self.tokens += tokens

    def add_step(self, grad_norm: float) -> None:
        self.per_step["grad_norm"] += grad_norm
        self.steps += 1

    def all_reduce(self, world: int) -> None:
        """Sum over the ranks (each ran its own micro-batches); ``grad_norm`` is the same on
        every rank, so its sum is divided by ``world``; maxima are reduced by max."""
        import torch.distributed as dist

        summed = sorted(self.weighted)
        steps = sorted(self.per_step)
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors
        values = torch.tensor([self.weighted[k] for k in summed] + [self.per_step[k] for k in steps]
                              + [self.tokens], dtype=torch.float64, device=device)
        dist.all_reduce(values)
        for i, key in enumerate(summed):
            self.weighted[key] = float(values[i])
        for i, key in enumerate(steps):
            scale = world if key == "grad_norm" else 1
            self.per_step[key] = float(values[len(summed) + i]) / scale
        self.tokens = float(values[-1])
        maxima = torch.tensor([self.maxima[k] for k in MAXIMA], dtype=torch.float64,
                              device=device)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        self.maxima = {k: float(v) for k, v in zip(MAXIMA, maxima, strict=True)}

    def result(self) -> dict[str, float]:
        out = {key: value / max(self.steps, 1) for key, value in self.per_step.items()}
        tokens = max(self.tokens, 1.0)
        means = {key: value / tokens for key, value in self.weighted.items() if key != "adv_sq"}
        out.update(means)
        if "adv_sq" in self.weighted:
            var = self.weighted["adv_sq"] / tokens - means.get("adv_mean", 0.0) ** 2
            out["adv_std"] = max(var, 0.0) ** 0.5
        out.update(self.maxima)
        out["num_tokens"] = self.tokens / self.epochs
        return out
