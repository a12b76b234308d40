"""The KL coefficient of ``loss.kl_in_reward``, fixed or adaptive (Ziegler et al. 2019,
"Fine-Tuning Language Models from Human Preferences", section 2.2, and TRL's
``AdaptiveKLController``: a target KL per sequence; verl's ``algorithm.kl_ctrl.type:
adaptive`` has the same rule with a per-token KL), by name.

adaptive, with target KL ``target``, horizon ``horizon`` and a batch of ``n`` sequences whose
mean KL (per sequence, summed over its tokens) was ``kl``::

    e     = clip(kl / target - 1, -0.2, 0.2)
    beta <- beta * (1 + e * n / horizon)

so the coefficient grows while the policy drifts further than ``target`` from the reference
and shrinks while it stays closer, by at most 20% per ``horizon`` sequences. fixed: beta stays.

What this module does NOT do: measure the KL (:func:`mgrpo.algo.kl.sequence_kl_penalty`), keep
the coefficient between rounds or save it (``mgrpo.training.reference``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

KLControl = Literal["fixed", "adaptive"]
CLIP = 0.2
"""Largest proportional error one update acts on (Ziegler et al.; TRL, verl)."""


def _fixed(coef: float, kl: float, n: int, target: float | None, horizon: int) -> float:
    return coef


def _adaptive(coef: float, kl: float, n: int, target: float | None, horizon: int) -> float:
    if target is None or target <= 0:
        raise ValueError(f"adaptive KL control needs a target KL > 0, got {target!r}")
    if horizon < 1:
        raise ValueError(f"adaptive KL control needs a horizon >= 1, got {horizon!r}")
    error = min(max(kl / target - 1.0, -CLIP), CLIP)
    return coef * (1.0 + error * n / horizon)


_CONTROLS: dict[str, Callable[[float, float, int, float | None, int], float]] = {
    "fixed": _fixed, "adaptive": _adaptive}
KL_CONTROLS: tuple[str, ...] = tuple(_CONTROLS)


def next_kl_coef(control: KLControl, coef: float, kl: float, n: int,
                 target: float | None = None, horizon: int = 10000) -> float:
    """The coefficient after a batch of ``n`` sequences with mean sequence KL ``kl``.

    Args: control "fixed" | "adaptive"; coef the current coefficient (>= 0); kl the batch's
    mean over sequences of sum_t k_t; n sequences in the batch (0: no change); target, horizon
    the adaptive controller's (ignored by "fixed"). Returns the new coefficient.
    """
    if control not in _CONTROLS:
        raise ValueError(f"unknown KL control {control!r}; valid: {list(KL_CONTROLS)}")
    if n <= 0:
        return coef
    return _CONTROLS[control](coef, kl, n, target, horizon)
