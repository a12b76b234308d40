"""Token-level clipped policy loss with KL to a reference (paper Eq. 14-19; docs/algorithm.md,
'1.4 Policy loss').

Per generated token (b, t):

    rho   = exp(logprobs - old_logprobs)
    l_pg  = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))      # PPO clip, DAPO eps
    l     = w * l_pg + kl_coef * kl(logprobs, ref_logprobs) - entropy_coef * H

(``w``: optional truncated importance weights pi_old / pi_rollout, default 1; ``kl``: one of
:mod:`mgrpo.algo.kl`'s estimators, whose gradients differ: see there; ``H``: the entropy of
each predictive distribution, with gradient, when ``entropy_coef > 0``.)

then ONE function, :func:`aggregate_loss`, reduces the (B, T) matrix to a scalar:

- ``token-mean``               sum(m*l) / sum(m)                       (DAPO, default)
- ``seq-mean-token-mean``      mean_b( sum_t(m*l) / sum_t(m) )         (original GRPO)
- ``seq-mean-token-sum-norm``  sum(m*l) / (B * L), L a constant budget  (Dr. GRPO)

Masked tokens (``response_mask == 0``: prompt, observations, padding, dropped samples) change
nothing: their log-ratios are replaced by 0 *before* ``exp``, so even inf/NaN there cannot leak
into the loss or its gradient.

What this module does NOT do: run the model, compute logprobs or entropy (the trainer passes
them), choose advantages, or step an optimiser.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mgrpo.algo.kl import KL_ESTIMATORS, KLEstimator, kl_penalty

__all__ = ["AGG_MODES", "KL_ESTIMATORS", "aggregate_loss", "kl_divergence", "policy_loss"]

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate_loss(loss_mat: Tensor, mask: Tensor, mode: AggMode = "token-mean", *,
                   norm_length: int | None = None) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar; the only place the aggregation is chosen.

    - token-mean:              ``sum(m*l) / sum(m)``
    - seq-mean-token-mean:     ``mean over sequences with >= 1 token of sum_t(m*l)/sum_t(m)``
      (sequences with no token, e.g. DAPO-dropped, are left out instead of counting as 0)
    - seq-mean-token-sum-norm: ``sum(m*l) / (B * L)``, L = ``norm_length`` or T (Dr. GRPO uses
      a constant L, the generation budget, so the scale does not depend on padding)

    An all-masked batch gives 0 (with a zero gradient), never NaN.

    Args:
        loss_mat: (B, T) float. mask: (B, T) bool or 0/1. mode: one of AGG_MODES.
        norm_length: L for seq-mean-token-sum-norm, default T.

    Returns:
        scalar tensor.
    """
    if loss_mat.dim() != 2 or mask.shape != loss_mat.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must "
                         "both be (B, T)")
    m = mask.to(loss_mat.dtype)
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat))
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        tokens = m.sum(dim=1)  # (B,)
        per_seq = masked.sum(dim=1) / tokens.clamp(min=1.0)
        return per_seq.sum() / (tokens > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        length = loss_mat.shape[1] if norm_length is None else norm_length
        if length < 1:
            raise ValueError(f"norm_length={norm_length} must be >= 1 (the generation budget)")
        return masked.sum() / (loss_mat.shape[0] * length)
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {list(AGG_MODES)}")


def kl_divergence(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator = "k3+"
                  ) -> Tensor:
    """Per-token KL term (B, T) of ``estimator``: :func:`mgrpo.algo.kl.kl_penalty`."""
    return kl_penalty(logprobs, ref_logprobs, estimator)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over ``mask`` (0 when the mask is empty), a 0-d tensor: no host read."""
    keep = mask.bool()
    total = torch.where(keep, values, torch.zeros_like(values)).sum()
    return total / keep.sum().clamp(min=1)


def _metrics(log_ratio: Tensor, adv: Tensor, mask: Tensor, eps_low: float, eps_high: float,
             ) -> dict[str, Tensor]:
    """Diagnostics over the unmasked tokens, beside the loss (as in cleanrl); 0-d float64."""
    with torch.no_grad():
        m = mask.to(torch.float64)
        rho = log_ratio.double().exp()
        low = ((rho < 1 - eps_low) & (adv < 0)).double()  # clipped: gradient cut, A < 0
        high = ((rho > 1 + eps_high) & (adv > 0)).double()  # clipped: gradient cut, A > 0
        adv_mean = _masked_mean(adv.double(), m)
        adv_var = _masked_mean((adv.double() - adv_mean) ** 2, m)
        return {
            "clipfrac_low": _masked_mean(low, m),
            "clipfrac_high": _masked_mean(high, m),
            "clipfrac": _masked_mean(low + high, m),
            # cleanrl's estimator of KL(old || new): mean((rho - 1) - log rho) >= 0
            "approx_kl": _masked_mean((rho - 1) - log_ratio.double(), m),
            "ratio_mean": _masked_mean(rho, m),
            "ratio_max": torch.where(m > 0, rho, torch.zeros_like(rho)).max()
            if m.numel() else torch.zeros((), dtype=torch.float64, device=m.device),
            "adv_mean": adv_mean,
            "adv_std": adv_var.sqrt(),
            "num_tokens": m.sum(),
        }


def _check_loss_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                       response_mask: Tensor, eps_low: float, eps_high: float, kl_coef: float,
                       ref_logprobs: Tensor | None) -> Tensor:
    """Reject bad arguments with the value and the fix; return advantages as (B, T)."""
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape \
            or response_mask.shape != logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, old_logprobs "
                         f"{tuple(old_logprobs.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must all be (B, T)")
    if not (0 <= eps_low < 1 and eps_high >= 0):
        raise ValueError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, got "
                         f"eps_low={eps_low}, eps_high={eps_high}; DAPO uses 0.2 / 0.28")
    if kl_coef != 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs (B, T) from the frozen "
                         "reference model; pass them or set kl_coef=0")
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages[:, None].expand_as(logprobs)
    if advantages.shape != logprobs.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be (B,) or (B, T) with "
                         f"(B, T) = {tuple(logprobs.shape)}")
    return advantages


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                response_mask: Tensor, *, eps_low: float = 0.2, eps_high: float = 0.28,
                agg: AggMode = "token-mean", ref_logprobs: Tensor | None = None,
                kl_coef: float = 0.0, kl_estimator: KLEstimator = "k3+",
                entropy: Tensor | None = None, norm_length: int | None = None,
                is_weights: Tensor | None = None, entropy_coef: float = 0.0,
                tensor_metrics: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss of GRPO/M-GRPO at token level (Eq. 14-19; DAPO clip-higher).

    ``l = max(-A*rho, -A*clip(rho, 1-eps_low, 1+eps_high)) + kl_coef * kl``, aggregated by
    :func:`aggregate_loss`. At rho = 1 the gradient w.r.t. logprobs is ``-A * m / normaliser``.

    Args:
        logprobs: (B, T) current policy log pi(a_t | s_t), requires grad.
        old_logprobs: (B, T) behaviour logprobs (from the rollout engine).
        advantages: (B,) per sequence (broadcast over its tokens) or (B, T) per token.
        response_mask: (B, T) 1 on generated tokens that are trained, else 0.
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]; default 0.2 / 0.28 (DAPO).
        agg: aggregation mode, see :func:`aggregate_loss`.
        ref_logprobs: (B, T) frozen reference logprobs; required if kl_coef > 0.
        kl_coef: weight of the KL term (default 0: no KL). kl_estimator: a name of
            :data:`mgrpo.algo.kl.KL_ESTIMATORS`; only k2, k1+ and k3+ have the gradient of
            KL(pi || pi_ref) (:mod:`mgrpo.algo.kl`; the run config refuses the others here).
        entropy: (B, T) per-token entropy, optional; a metric, and with ``entropy_coef > 0``
            the bonus ``- entropy_coef * agg(entropy)`` (then it must carry its gradient).
        norm_length: constant L for seq-mean-token-sum-norm.
        is_weights: (B, T) constant per-token weights on the policy-gradient term (truncated
            importance sampling pi_old / pi_rollout, :mod:`mgrpo.algo.rollout_correction`);
            ``None`` = 1. The KL term is not weighted.
        entropy_coef: weight of the entropy bonus (default 0; verl ``entropy_coeff``).
        tensor_metrics: the metrics as detached 0-d float64 tensors on the loss's device
            instead of floats: no host read, so a GPU's micro-batch loop keeps the device
            busy (the default reads them all back in one copy).

    Returns:
        (loss scalar, metrics): loss, pg_loss, clipfrac_low, clipfrac_high, clipfrac,
        approx_kl, ratio_mean, ratio_max, adv_mean, adv_std, num_tokens, and entropy / kl
        when given.
    """
    advantages = _check_loss_inputs(logprobs, old_logprobs, advantages, response_mask,
                                    eps_low, eps_high, kl_coef, ref_logprobs)
    mask = response_mask.bool()
    zeros = torch.zeros_like(logprobs)
    adv = torch.where(mask, advantages.to(logprobs.dtype), zeros).detach()
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zeros)
    rho = torch.exp(log_ratio)
    pg_mat = torch.maximum(-adv * rho, -adv * torch.clamp(rho, 1 - eps_low, 1 + eps_high))
    if is_weights is not None:
        if is_weights.shape != logprobs.shape:
            raise ValueError(f"is_weights {tuple(is_weights.shape)} must be (B, T) = "
                             f"{tuple(logprobs.shape)}")
        pg_mat = pg_mat * torch.where(mask, is_weights.detach().to(pg_mat.dtype), zeros)
    pg_loss = aggregate_loss(pg_mat, mask, agg, norm_length=norm_length)
    loss = pg_loss
    metrics = _metrics(log_ratio.detach(), adv, mask, eps_low, eps_high)
    if ref_logprobs is not None:
        # Zero both sides on masked tokens first: x = 0 there, so garbage cannot reach exp().
        kl_mat = kl_divergence(torch.where(mask, logprobs, zeros),
                               torch.where(mask, ref_logprobs.detach(), zeros), kl_estimator)
        metrics["kl"] = _masked_mean(kl_mat.detach().double(), mask)
        if kl_coef != 0:
            loss = loss + kl_coef * aggregate_loss(kl_mat, mask, agg, norm_length=norm_length)
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy.detach().double(), mask)
        if entropy_coef != 0:
            ent = torch.where(mask, entropy, zeros)
            loss = loss - entropy_coef * aggregate_loss(ent, mask, agg, norm_length=norm_length)
    elif entropy_coef != 0:
        raise ValueError(f"entropy_coef={entropy_coef} needs entropy (B, T) with its gradient")
    metrics["pg_loss"] = pg_loss.detach().double()
    metrics["loss"] = loss.detach().double()
    if tensor_metrics:
        return loss, metrics
    host = torch.stack(list(metrics.values())).tolist()
    return loss, dict(zip(metrics, host, strict=True))
