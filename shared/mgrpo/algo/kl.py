"""Per-token KL estimators between the policy and a frozen reference (Schulman, "Approximating
KL Divergence", 2020; verl ``trainer/ppo/core_algos.py`` ``kl_penalty``), by name.

With ``x = logprobs - ref_logprobs`` (log pi(a) - log pi_ref(a), a sampled from pi):

======  ========================================  =======================================
name    value (each an estimate of KL(pi||ref))   expected gradient E_pi[grad k]
======  ========================================  =======================================
k1      x                                          0 (E_pi[grad log pi] = 0)
k2      x^2 / 2                                    grad KL(pi || pi_ref)
k3      e^{-x} + x - 1  (x clamped to [-20, 20],   grad KL(pi_ref || pi), the REVERSE KL
        the value to [-10, 10], as verl does)
k1+     value of k1, gradient of k2                grad KL(pi || pi_ref)
k3+     value of k3, gradient of k2                grad KL(pi || pi_ref)
======  ========================================  =======================================

Why (one sample a ~ pi, g = grad log pi(a)): grad k1 = g; grad k2 = x g; grad k3 = (1 - e^{-x}) g
= (1 - pi_ref/pi) g, whose expectation is -sum_a pi_ref grad log pi = grad KL(pi_ref || pi).
grad KL(pi || pi_ref) = E_pi[x g], which is k2's. The "+" names are straight-through: the
forward value is kN's (what is reported and, in the reward, what is subtracted), the backward
is k2's (``k2 - k2.detach() + kN.detach()``, verl's construction).

As a LOSS term only :data:`KL_LOSS_ESTIMATORS` (k2, k1+, k3+) regularise toward the reference
in the sense of KL(pi || pi_ref) (``tests/unit/algo/test_algo_kl.py`` checks it by exact
enumeration on a 6-way softmax); k1 and k3 belong in the reward (``loss.kl_in_reward``), where
only the value matters and k1 is the usual choice (verl's ``use_kl_in_reward``, ``kl_penalty:
kl``).

What this module does NOT do: run a model, choose the coefficient, or aggregate over tokens
(:func:`mgrpo.algo.loss.aggregate_loss` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3", "k1+", "k3+"]


def _k1(x: Tensor) -> Tensor:
    return x


def _k2(x: Tensor) -> Tensor:
    return 0.5 * x * x


def _k3(x: Tensor) -> Tensor:
    # verl's low_var_kl: exp(ref - logp) - (ref - logp) - 1, clamped for numerical safety
    neg = torch.clamp(-x, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)


_VALUES: dict[str, Callable[[Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "k1+", "k3+")
KL_LOSS_ESTIMATORS: tuple[str, ...] = ("k2", "k1+", "k3+")
"""Estimators whose expected gradient is grad KL(pi || pi_ref): the ones a loss term may use."""


def _check(estimator: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {list(KL_ESTIMATORS)}")


def kl_value(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """The forward value of ``estimator`` per token (for "k1+"/"k3+": k1's/k3's value).

    Args: logprobs, ref_logprobs (B, T). Returns (B, T); differentiable as the plain kN.
    """
    _check(estimator)
    return _VALUES[estimator.rstrip("+")](logprobs - ref_logprobs)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token KL term with ``estimator``'s value and gradient (verl ``kl_penalty``).

    k1/k2/k3: the plain estimator. k1+/k3+: straight-through, the value of k1/k3 and the
    gradient of k2 w.r.t. ``logprobs`` (``k2 - k2.detach() + kN.detach()``).

    Args: logprobs (B, T), requires grad for a loss; ref_logprobs (B, T), constant.
    Returns (B, T).
    """
    value = kl_value(logprobs, ref_logprobs, estimator)
    if not estimator.endswith("+"):
        return value
    backward = _k2(logprobs - ref_logprobs)
    return backward - backward.detach() + value.detach()


def sequence_kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor,
                        estimator: KLEstimator, kl_coef: float) -> Tensor:
    """KL in the reward (verl ``apply_kl_penalty``): each generated token's reward is lowered
    by ``kl_coef * k_t``; an outcome-reward estimator (GRPO) uses the sequence's total, so the
    sequence's reward falls by ``kl_coef * sum_t m_t k_t``. No gradient (a reward is data).

    Args: logprobs (B, T) of the policy that sampled; ref_logprobs (B, T); response_mask
    (B, T) 1 on generated tokens. Returns (B,) the amount to subtract from each reward.
    """
    with torch.no_grad():
        mask = response_mask.bool()
        zeros = torch.zeros_like(logprobs)
        per_token = kl_value(torch.where(mask, logprobs, zeros),
                             torch.where(mask, ref_logprobs, zeros), estimator)
        return kl_coef * torch.where(mask, per_token, zeros).sum(dim=1)
