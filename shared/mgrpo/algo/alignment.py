"""Sub-agent trajectory alignment to d slots per rollout (paper Sec. 3, Eq. 9-13; docs/algorithm.md,
'Sub-agents: trajectory alignment').

Rollout k of a query calls a sub-agent d_k times (d_k varies, may be 0). M-GRPO gives every
rollout the same number of slots d so the K rollouts of a query form a fixed-size group:

- d_k > d:      keep d of the d_k sub-trajectories, d distinct picks uniformly (drop d_k - d);
- d_k = d:      keep all of them (no randomness used);
- 0 < d_k < d:  keep all d_k once, and fill the other d - d_k slots with uniform duplicates
                of them (with replacement, so d - d_k may exceed d_k);
- d_k = 0:      the rollout's d slots are masked (index -1, weight 0). Not in the paper, which
                does not say what to do; masking is the only choice that invents no sample.

Within a rollout the chosen sub-trajectories are listed in ascending index order, so slots
follow invocation order and a duplicate sits next to its original.

Each slot is one training sample: a duplicated trajectory is trained once per slot, with the
same advantage (as in the paper, where duplication re-weights rollouts with few calls).

What this module does NOT do: compute rewards or statistics (``groups``), or read d_k from the
store (the trainer passes the observed counts to :func:`auto_d`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class AlignedSlots(NamedTuple):
    """The aligned slot table of one sub-agent type for a batch of queries.

    S = (number of distinct queries) * K * d. Slots of query q, rollout k are contiguous.
    """

    traj_index: Tensor  # (S,) long: index into the input trajectories, -1 on masked slots
    weight: Tensor  # (S,) float 0/1: 0 on masked slots (d_k = 0)
    group_ids: Tensor  # (S,) long: the query id of each slot (the M-GRPO sub-agent group)
    rollout: Tensor  # (S,) long: the rollout k of each slot


def _check_d(d: int, num_rollouts: int) -> None:
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d={d!r} must be an integer >= 1 (slots per rollout); use auto_d() "
                         "on the observed call counts for the 'auto' setting")
    if isinstance(num_rollouts, bool) or not isinstance(num_rollouts, int) or num_rollouts < 1:
        raise ValueError(f"num_rollouts={num_rollouts!r} must be an integer >= 1 (K)")


def _pick(d_k: int, d: int, generator: torch.Generator) -> Tensor:
    """Positions (0..d_k-1) of the d sub-trajectories kept for one rollout, ascending."""
    if d_k == d:
        return torch.arange(d)
    if d_k > d:
        return torch.randperm(d_k, generator=generator)[:d].sort().values
    extra = torch.randint(d_k, (d - d_k,), generator=generator)
    return torch.cat([torch.arange(d_k), extra]).sort().values


def align_subagents(rollout_index: Tensor, num_rollouts: int, d: int, *,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Align the sub-trajectories of ONE query to exactly d slots per rollout (Sec. 3).

    Args:
        rollout_index: (n,) long: the rollout k in [0, K) of each sub-trajectory of the query.
        num_rollouts: K.
        d: slots per rollout, >= 1.
        generator: a seeded torch.Generator; the same seed gives the same alignment.

    Returns:
        index: (K*d,) long into the n sub-trajectories, -1 on masked slots; slots
            k*d .. k*d+d-1 belong to rollout k.
        weight: (K*d,) float, 1.0 on real slots and 0.0 on masked ones.
    """
    _check_d(d, num_rollouts)
    rollout_index = torch.as_tensor(rollout_index).long()
    if rollout_index.dim() != 1:
        raise ValueError(f"rollout_index must be 1-D (n,), got {tuple(rollout_index.shape)}")
    if rollout_index.numel() and (rollout_index.min() < 0 or rollout_index.max() >= num_rollouts):
        raise ValueError(f"rollout_index values must lie in [0, {num_rollouts}), got "
                         f"[{int(rollout_index.min())}, {int(rollout_index.max())}]; "
                         "pass the rollout number k of each sub-trajectory and K")
    index = torch.full((num_rollouts * d,), -1, dtype=torch.long)
    weight = torch.zeros(num_rollouts * d)
    for k in range(num_rollouts):
        members = torch.nonzero(rollout_index == k).flatten()  # ascending positions
        if members.numel() == 0:
            continue  # d_k = 0: the rollout's slots stay masked
        index[k * d:(k + 1) * d] = members[_pick(members.numel(), d, generator)]
        weight[k * d:(k + 1) * d] = 1.0
    return index, weight


def align_batch(query_index: Tensor, rollout_index: Tensor, num_rollouts: int, d: int, *,
                generator: torch.Generator) -> AlignedSlots:
    """Align one sub-agent type's trajectories for a batch of queries, query by query.

    Queries are processed in ascending id order with the one generator, so the result depends
    only on the inputs and the generator's seed (not on the input order of queries). Queries
    with no trajectory of this sub-agent type get no slots (they would be all masked).

    Args:
        query_index: (n,) long: the query id of each sub-trajectory.
        rollout_index: (n,) long: its rollout k in [0, K).
        num_rollouts: K. d: slots per rollout. generator: seeded torch.Generator.

    Returns:
        AlignedSlots with S = (distinct queries) * K * d rows; ``traj_index`` indexes the n
        inputs.
    """
    query_index = torch.as_tensor(query_index).long()
    rollout_index = torch.as_tensor(rollout_index).long()
    if query_index.shape != rollout_index.shape or query_index.dim() != 1:
        raise ValueError(f"query_index {tuple(query_index.shape)} and rollout_index "
                         f"{tuple(rollout_index.shape)} must be 1-D of the same length n")
    _check_d(d, num_rollouts)
    parts: list[AlignedSlots] = []
    for query in torch.unique(query_index, sorted=True).tolist():
        members = torch.nonzero(query_index == query).flatten()
        local, weight = align_subagents(rollout_index[members], num_rollouts, d,
                                        generator=generator)
        global_index = torch.where(local >= 0, members[local.clamp(min=0)], local)
        slots = num_rollouts * d
        parts.append(AlignedSlots(global_index, weight, torch.full((slots,), query),
                                  torch.arange(num_rollouts).repeat_interleave(d)))
    if not parts:
        empty = torch.zeros(0, dtype=torch.long)
        return AlignedSlots(empty, torch.zeros(0), empty, empty)
    return AlignedSlots(*(torch.cat(column) for column in zip(*parts, strict=True)))


def auto_d(d_counts: Tensor, quantile: float = 0.99) -> int:
    """The 'auto' alignment size: the ``quantile`` of observed call counts d_k, at least 1.

    ``d = max(1, Q_q(d_k))`` with the inverted-CDF quantile ``Q_q = min{x : F(x) >= q}``
    (numpy's ``method="inverted_cdf"``): d is an observed count, and it is the smallest one
    for which at least a fraction ``quantile`` of rollouts need no dropping. Rollouts with
    d_k = 0 are observations too. With no observation at all, d = 1.

    Args:
        d_counts: (R,) integer: d_k of each observed rollout (this round's, or the store's).
        quantile: in (0, 1], default 0.99 (the paper's 99th percentile).

    Returns:
        int d >= 1.
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile={quantile} must lie in (0, 1]; the paper uses 0.99")
    counts = torch.as_tensor(d_counts, dtype=torch.float64).flatten()
    if counts.numel() == 0:
        return 1
    if (counts < 0).any() or (counts != counts.round()).any():
        raise ValueError(f"d_counts must be non-negative integers (calls per rollout), got "
                         f"{counts[(counts < 0) | (counts != counts.round())][:3].tolist()}")
    ordered = counts.sort().values
    # 1e-9: q*n like 0.29*100 = 28.999999999999996 must not round down a rank.
    rank = max(math.ceil(quantile * len(ordered) - 1e-9), 1)
    return max(1, int(ordered[rank - 1]))
