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

Values may be 0-d tensors on the model's device (``policy_loss(..., tensor_metrics=True)``):
they are summed there and read back to the host once, in :meth:`UpdateTotals.result` or
:meth:`UpdateTotals.all_reduce`, so a GPU's micro-batch loop never waits for the host.

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

    def add_micro(self, metrics: dict[str, float | torch.Tensor], share: float | torch.Tensor,
                  tokens: float | torch.Tensor) -> None:
        """One micro-batch's :func:`policy_loss` metrics: ``share`` its weight in the step's
        loss, ``tokens`` its trained tokens (0 for a padding pass of a short rank). Floats or
        0-d tensors; nothing here reads a tensor back to the host."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.double()
        for key, value in metrics.items():
            if key in PER_STEP:
                self.per_step[key] += value * share
            elif key in MAXIMA:
                self.maxima[key] = _masked_max(self.maxima[key], value, tokens)
            elif key == "adv_std":
                mean = metrics.get("adv_mean", 0.0)
                self.weighted["adv_sq"] += (value * value + mean * mean) * tokens
            elif key != "num_tokens":
                self.weighted[key] += value * tokens
        self.tokens += tokens

    def add_step(self, grad_norm: float | torch.Tensor) -> None:
        if isinstance(grad_norm, torch.Tensor):
            grad_norm = grad_norm.double()
        self.per_step["grad_norm"] += grad_norm
        self.steps += 1

    def all_reduce(self, world: int) -> None:
        """Sum over the ranks (each ran its own micro-batches); ``grad_norm`` is the same on
        every rank, so its sum is divided by ``world``; maxima are reduced by max."""
        import torch.distributed as dist

        self._to_host()
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

    def _to_host(self) -> None:
        """Every accumulated tensor read back as a float, in one device-to-host copy."""
        slots = [(d, k) for d in (self.weighted, self.maxima, self.per_step) for k in d
                 if isinstance(d[k], torch.Tensor)]
        values = [d[k] for d, k in slots]
        if isinstance(self.tokens, torch.Tensor):
            slots.append((None, "tokens"))
            values.append(self.tokens)
        if not values:
            return
        host = torch.stack([v.detach().double().reshape(()) for v in values]).tolist()
        for (d, k), value in zip(slots, host, strict=True):
            if d is None:
                self.tokens = value
            else:
                d[k] = value

    def result(self) -> dict[str, float]:
        self._to_host()
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


def _masked_max(current: float | torch.Tensor, value: float | torch.Tensor,
                tokens: float | torch.Tensor) -> float | torch.Tensor:
    """``max(current, value)`` where the micro-batch trained tokens, else ``current``."""
    if not any(isinstance(x, torch.Tensor) for x in (current, value, tokens)):
        return max(current, value) if tokens > 0 else current
    value, tokens = torch.as_tensor(value).double(), torch.as_tensor(tokens)
    current = torch.as_tensor(current, dtype=torch.float64, device=value.device)
    return torch.where(tokens.to(value.device) > 0, torch.maximum(current, value), current)
