"""Train/inference agreement: how far the sampler's logprobs are from the trainer's, and
truncated importance sampling (TIS) to correct for it (as verl's "rollout correction",
decoupled mode).

Three policies meet in one update: pi_rollout (the engine that sampled the tokens: another
backend, precision or kernel), pi_old (the trainer's own forward pass over the same tokens
before the update) and pi_theta (the trainer during the update). The PPO ratio corrects
pi_old -> pi_theta; nothing corrects pi_rollout -> pi_old unless the rollout logprobs are
kept. With them, per generated token t:

    delta_t = logp_old_t - logp_rollout_t
    token:     w_t = min(exp(clamp(delta_t, -20, 20)), C)
    sequence:  w_t = min(exp(clamp(sum_s m_s * delta_s, -20, 20)), C)   (same w for the row)

``C`` is ``rollout_is_threshold``; ``[-20, 20]`` is verl's safety bound (no overflow). The
weights are constants (no gradient) that multiply the per-token policy loss; they are 0 where
``mask == 0``.

What this module does NOT do: rejection sampling (verl's ``rollout_rs``), batch
normalisation of the weights, or run any model.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

RolloutIS = Literal["none", "token", "sequence"]
ROLLOUT_IS_LEVELS: tuple[str, ...] = ("none", "token", "sequence")
SAFETY_BOUND = 20.0


def rollout_mismatch(train_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor,
                     ) -> dict[str, float]:
    """Mean and max of ``|logp_train - logp_rollout|`` over tokens with ``mask == 1``.

    Also ``rollout_kl``: the k3 estimate of KL(pi_rollout || pi_train) from the rollout's
    samples, ``mean(exp(d) - d - 1)`` with ``d = logp_train - logp_rollout`` (>= 0, 0 when
    the two agree). An all-masked batch gives zeros.

    Args: train_logprobs, rollout_logprobs, mask: (B, T).
    Returns: {"logp_diff_mean", "logp_diff_max", "rollout_kl"}.
    """
    if train_logprobs.shape != rollout_logprobs.shape or mask.shape != train_logprobs.shape:
        raise ValueError(f"train_logprobs {tuple(train_logprobs.shape)}, rollout_logprobs "
                         f"{tuple(rollout_logprobs.shape)} and mask {tuple(mask.shape)} must "
                         "all be (B, T)")
    keep = mask.bool()
    count = int(keep.sum())
    if count == 0:
        return {"logp_diff_mean": 0.0, "logp_diff_max": 0.0, "rollout_kl": 0.0}
    d = (train_logprobs.double() - rollout_logprobs.double())[keep]
    return {"logp_diff_mean": float(d.abs().mean()), "logp_diff_max": float(d.abs().max()),
            "rollout_kl": float((torch.exp(d) - d - 1.0).mean())}


def rollout_is_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor,
                       level: RolloutIS = "token", threshold: float = 2.0) -> Tensor | None:
    """Truncated IS weights pi_old / pi_rollout, (B, T), detached; ``None`` for ``"none"``.

    See the module docstring for the formulas. ``threshold`` must be >= 1 (a cap below 1
    would down-weight tokens the two engines agree on).
    """
    if level == "none":
        return None
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={level!r}; valid: {list(ROLLOUT_IS_LEVELS)}")
    if threshold < 1:
        raise ValueError(f"rollout_is_threshold={threshold} must be >= 1 (verl uses 2.0)")
    if old_logprobs.shape != rollout_logprobs.shape or mask.shape != old_logprobs.shape:
        raise ValueError(f"old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs "
                         f"{tuple(rollout_logprobs.shape)} and mask {tuple(mask.shape)} must "
                         "all be (B, T)")
    with torch.no_grad():
        keep = mask.bool()
        delta = torch.where(keep, old_logprobs.double() - rollout_logprobs.double(),
                            torch.zeros_like(old_logprobs, dtype=torch.float64))
        if level == "sequence":
            delta = delta.sum(dim=1, keepdim=True).expand_as(delta)
        weights = torch.exp(delta.clamp(-SAFETY_BOUND, SAFETY_BOUND)).clamp(max=threshold)
        return torch.where(keep, weights, torch.zeros_like(weights)).to(old_logprobs.dtype)


def is_weight_metrics(weights: Tensor, mask: Tensor, threshold: float) -> dict[str, float]:
    """Mean of the weights and share of tokens whose weight hit the cap (over ``mask``)."""
    keep = mask.bool()
    if int(keep.sum()) == 0:
        return {"rollout_is_mean": 0.0, "rollout_is_capped": 0.0}
    w = weights.double()[keep]
    return {"rollout_is_mean": float(w.mean()),
            "rollout_is_capped": float((w >= threshold).double().mean())}
