"""Group statistics and group-relative advantages (paper Eq. 6-13; docs/algorithm.md,
'Statistics and the advantage').

A *group* is the set of samples whose rewards are compared with each other: the K rollouts of
one query (GRPO, the M-GRPO planner), the d*K aligned sub-agent slots of one query (M-GRPO
sub-agents), or the K candidates of one (query, agent, turn) (AT-GRPO). Groups are named by an
integer id per sample; ids need not be contiguous or sorted.

Everything here is a pure tensor function. Statistics are computed in float64, because the
trainers publish them to the stats store and read them back, and the numbers must not depend on
which side computed them.

Conventions every function shares:
- population std: ``sigma_g = sqrt(mean_g((r - mu_g)^2))`` (1/n, not 1/(n-1));
- a group whose (unmasked) rewards are all equal has ``std == 0`` and ``mean`` equal to that
  reward *exactly*, and its advantages are exactly 0 (never NaN, never 1e-11 round-off);
- masked samples (``mask == False``) are left out of the statistics and get advantage 0.

What this module does NOT do: choose the groups (see ``alignment`` for sub-agent slots and
``estimators`` for the per-algorithm keys), talk to the store, or compute losses.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

Scale = Literal["std", "none"]
SCALES: tuple[str, ...] = ("std", "none")


class GroupStats(NamedTuple):
    """Per-group statistics, one row per group, ordered by ascending group id.

    This is what a trainer publishes to the stats store (docs/services.md, 'One round
    (distributed)', step 5). Store mean and std
    as double precision: read back through float32 they give slightly different advantages.
    """

    group_ids: Tensor  # (G,) long, sorted ascending, unique
    count: Tensor  # (G,) long: unmasked samples in the group (duplicated slots count)
    mean: Tensor  # (G,) float64: mu_g
    std: Tensor  # (G,) float64: population sigma_g; exactly 0 for constant groups


def _check_rewards(rewards: Tensor, group_ids: Tensor, mask: Tensor | None) -> Tensor:
    """Validate shapes and values at the public boundary; return the mask as bool (N,)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}; "
                         "flatten it or pass one reward per sample")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape "
                         f"{tuple(rewards.shape)}: one group id per reward")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}; "
                         "use .long()")
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    elif mask.shape != rewards.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal rewards shape "
                         f"{tuple(rewards.shape)}")
    mask = mask.bool()
    if not torch.isfinite(rewards[mask]).all():
        bad = rewards[mask][~torch.isfinite(rewards[mask])][:3].tolist()
        raise ValueError(f"rewards must be finite on unmasked samples, found {bad}; "
                         "fix the reward function or mask those samples")
    return mask


def group_stats(rewards: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> GroupStats:
    """Count, mean and population std of ``rewards`` per group (Eq. 6-7, 10-11).

    ``mu_g = (1/n_g) sum_{i in g} r_i``, ``sigma_g = sqrt((1/n_g) sum_{i in g} (r_i - mu_g)^2)``
    over the unmasked samples of g. Groups with no unmasked sample are absent from the result.

    Args:
        rewards: (N,) float.
        group_ids: (N,) integer group id per sample.
        mask: (N,) bool or 0/1, optional; False samples are left out (masked alignment slots).

    Returns:
        GroupStats with (G,) tensors, groups in ascending id order. Unpacks as
        ``(unique_ids, count, mean, std)``.
    """
    mask = _check_rewards(rewards, group_ids, mask)
    values = rewards[mask].to(torch.float64)
    ids = group_ids[mask].long()
    unique_ids, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    num_groups = unique_ids.numel()
    count = torch.zeros(num_groups, dtype=torch.long).index_add_(0, inverse,
                                                                  torch.ones_like(ids))
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, values)
    mean = total / count.clamp(min=1)
    # Two passes (mean, then squared deviations) rather than E[x^2]-E[x]^2: no cancellation.
    sq_dev = (values - mean[inverse]) ** 2
    var = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, sq_dev)
    std = (var / count.clamp(min=1)).sqrt()
    # Constant groups: force the exact mean and a zero std, so their advantages are exactly 0
    # (sum/count of equal floats is not always that float, e.g. 3 x 0.1).
    g_max = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, inverse, values, reduce="amax")
    g_min = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce(
        0, inverse, values, reduce="amin")
    constant = g_max == g_min
    mean = torch.where(constant, g_max, mean)
    std = torch.where(constant, torch.zeros_like(std), std)
    return GroupStats(unique_ids, count, mean, std)


def advantages_from_stats(rewards: Tensor, group_ids: Tensor, stats: GroupStats, *,
                          scale: Scale = "std", eps: float = 1e-6,
                          mask: Tensor | None = None) -> Tensor:
    """Group-relative advantages from statistics, e.g. read back from the stats store (Eq. 8, 12).

    ``A_i = (r_i - mu_g) / (sigma_g + eps)`` for ``scale="std"`` (GRPO),
    ``A_i = r_i - mu_g`` for ``scale="none"`` (Dr. GRPO); exactly 0 where ``sigma_g == 0`` and
    on masked samples. Same numbers as :func:`group_advantages` given its own statistics.

    Args:
        rewards: (N,) float.
        group_ids: (N,) integer; every unmasked sample's group must be in ``stats``.
        stats: GroupStats (any row order); rows of other groups are ignored.
        scale: "std" or "none".
        eps: added to sigma; must be > 0 with scale="std".
        mask: (N,) bool, optional.

    Returns:
        (N,) advantages in ``rewards.dtype``.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not one of {SCALES}: use 'std' (GRPO) or "
                         "'none' (Dr. GRPO)")
    if scale == "std" and not eps > 0:
        raise ValueError(f"eps={eps} must be > 0 with scale='std' so sigma + eps > 0")
    mask = _check_rewards(rewards, group_ids, mask)
    order = torch.argsort(stats.group_ids)
    sorted_ids = stats.group_ids[order].long()
    if sorted_ids.numel() == 0:
        if mask.any():
            raise ValueError("stats is empty but some samples are unmasked; publish "
                             "group_stats for every group (or mask those samples)")
        return torch.zeros_like(rewards)
    pos = torch.searchsorted(sorted_ids, group_ids.long()).clamp(max=len(sorted_ids) - 1)
    missing = mask & (sorted_ids[pos] != group_ids.long())
    if missing.any():
        ids = torch.unique(group_ids[missing])[:5].tolist()
        raise ValueError(f"groups {ids} have unmasked samples but no statistics; publish "
                         "group_stats for every group (or mask those samples)")
    row = order[pos]
    mean = stats.mean.to(torch.float64)[row]
    std = stats.std.to(torch.float64)[row]
    centred = rewards.to(torch.float64) - mean
    adv = centred / (std + eps) if scale == "std" else centred
    adv = torch.where(mask & (std > 0), adv, torch.zeros_like(adv))
    return adv.to(rewards.dtype)


def group_advantages(rewards: Tensor, group_ids: Tensor, scale: Scale = "std",
                     eps: float = 1e-6, mask: Tensor | None = None) -> Tensor:
    """GRPO group-relative advantages (Eq. 6-8 for the planner, 10-12 for aligned sub-agents).

    ``A_i = (r_i - mu_g) / (sigma_g + eps)`` with population sigma; ``scale="none"`` gives
    ``r_i - mu_g`` (Dr. GRPO). Equal rewards in a group give exactly 0.

    Args:
        rewards: (N,) float.
        group_ids: (N,) integer.
        scale: "std" or "none".
        eps: stabiliser added to sigma.
        mask: (N,) bool, optional: masked samples are excluded from mu/sigma and get 0.

    Returns:
        (N,) advantages in ``rewards.dtype``.
    """
    stats = group_stats(rewards, group_ids, mask)
    return advantages_from_stats(rewards, group_ids, stats, scale=scale, eps=eps, mask=mask)


def dynamic_sampling_mask(rewards: Tensor, group_ids: Tensor,
                          mask: Tensor | None = None) -> Tensor:
    """DAPO dynamic-sampling filter: keep only groups whose rewards vary (DAPO, Yu et al. 2025).

    A group with zero reward variance (all correct or all wrong) has advantage 0 everywhere, so
    it adds no gradient but still dilutes the token-mean denominator; DAPO drops it.

    Args:
        rewards: (N,) float; group_ids: (N,) integer; mask: (N,) bool, optional.

    Returns:
        (N,) bool: True where the sample's group has sigma > 0 (and the sample is unmasked).
    """
    stats = group_stats(rewards, group_ids, mask)
    varying = stats.group_ids[stats.std > 0]
    return torch.isin(group_ids.long(), varying) & _check_rewards(rewards, group_ids, mask)


def greedy_choice(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """AT-GRPO greedy continuation: the best candidate of each group (Stronger-MAS, tree sampling).

    ``best_g = argmax_{i in g} r_i``, ties broken by the lowest sample index.

    Args:
        rewards: (N,) float, finite.
        group_ids: (N,) integer.

    Returns:
        (G,) long: index into the N samples of each group's best candidate, groups in
        ascending id order (the order of ``torch.unique(group_ids)``).
    """
    _check_rewards(rewards, group_ids, None)
    unique_ids, inverse = torch.unique(group_ids.long(), sorted=True, return_inverse=True)
    num_groups = unique_ids.numel()
    values = rewards.to(torch.float64)
    best = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, inverse, values, reduce="amax")
    index = torch.arange(rewards.numel())
    candidates = torch.where(values == best[inverse], index, torch.full_like(index, len(index)))
    return torch.full((num_groups,), len(index), dtype=torch.long).scatter_reduce(
        0, inverse, candidates, reduce="amin")
