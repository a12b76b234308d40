"""The advantage math of GRPO, Dr. GRPO, M-GRPO and AT-GRPO: pure functions from rewards (plus
the ids that define their groups) to per-sample advantages and a ``keep`` flag.

``keep`` is False for samples that must not enter the loss: masked alignment slots (d_k = 0)
and, with ``dynamic_sampling=True``, every sample of a group with zero reward variance (DAPO).
The trainer multiplies its response mask by ``keep``.

| function              | groups                                     | scale        |
| --------------------- | ------------------------------------------ | ------------ |
| grpo_advantages       | caller's group_ids (the query)             | std          |
| dr_grpo_advantages    | caller's group_ids (the query)             | none         |
| planner_advantages    | the query                                  | std or none  |
| subagent_advantages   | query, after alignment to d slots/rollout  | std or none  |
| mgrpo_advantages      | both sides at once                         | std or none  |
| at_grpo_advantages    | (query, agent, turn) (``GROUPINGS``)       | std or none  |

What this module does NOT do: compute rewards, losses, or read/write the stats store, or
choose an estimator by name (``mgrpo.algo.estimators``: the registry, one signature for all).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from mgrpo.algo.alignment import AlignedSlots, align_batch, auto_d
from mgrpo.algo.groups import Scale, dynamic_sampling_mask, group_advantages


class GroupAdvantages(NamedTuple):
    advantages: Tensor  # (N,) float
    keep: Tensor  # (N,) bool: False = leave out of the loss (DAPO-filtered)
    group_ids: Tensor  # (N,) long: the group each sample was normalised in


class AlignedAdvantages(NamedTuple):
    """One sub-agent type's aligned slots with their rewards and advantages (S rows)."""

    traj_index: Tensor  # (S,) long into the input trajectories, -1 on masked slots
    weight: Tensor  # (S,) float 0/1
    group_ids: Tensor  # (S,) long: query id
    rollout: Tensor  # (S,) long: rollout k
    rewards: Tensor  # (S,) float: the reward of traj_index, 0 on masked slots
    advantages: Tensor  # (S,) float: 0 on masked slots
    keep: Tensor  # (S,) bool: weight > 0, and the group varies if dynamic_sampling


class SubagentRollouts(NamedTuple):
    """One sub-agent type's trajectories for a batch (n rows), input of ``mgrpo``."""

    query_index: Tensor  # (n,) long
    rollout_index: Tensor  # (n,) long in [0, K)
    rewards: Tensor  # (n,) float: R_S (Eq. 5)


class MGRPOAdvantages(NamedTuple):
    planner: GroupAdvantages
    subagents: dict[str, AlignedAdvantages]
    d: dict[str, int]  # the d used per sub-agent type (resolved from 'auto')


def _keep(rewards: Tensor, group_ids: Tensor, dynamic_sampling: bool,
          mask: Tensor | None = None) -> Tensor:
    if dynamic_sampling:
        return dynamic_sampling_mask(rewards, group_ids, mask)
    return torch.ones_like(rewards, dtype=torch.bool) if mask is None else mask.bool()


def grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
                    dynamic_sampling: bool = False) -> GroupAdvantages:
    """GRPO (Shao et al. 2024; M-GRPO Eq. 6-8): ``A = (r - mu_g) / (sigma_g + eps)``.

    rewards (N,), group_ids (N,) -> GroupAdvantages of (N,) tensors.
    """
    adv = group_advantages(rewards, group_ids, scale="std", eps=eps)
    return GroupAdvantages(adv, _keep(rewards, group_ids, dynamic_sampling), group_ids.long())


def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
                       dynamic_sampling: bool = False) -> GroupAdvantages:
    """Dr. GRPO (Liu et al. 2025): ``A = r - mu_g`` (no std scaling; eps unused).

    rewards (N,), group_ids (N,) -> GroupAdvantages of (N,) tensors.
    """
    adv = group_advantages(rewards, group_ids, scale="none", eps=eps)
    return GroupAdvantages(adv, _keep(rewards, group_ids, dynamic_sampling), group_ids.long())


def planner_advantages(rewards: Tensor, query_ids: Tensor, *, scale: Scale = "std",
                       eps: float = 1e-6, dynamic_sampling: bool = False) -> GroupAdvantages:
    """M-GRPO planner advantages (Eq. 6-8): one group per query over its K rollouts.

    rewards (N,) R_M (Eq. 4), query_ids (N,) -> GroupAdvantages of (N,) tensors.
    """
    adv = group_advantages(rewards, query_ids, scale=scale, eps=eps)
    return GroupAdvantages(adv, _keep(rewards, query_ids, dynamic_sampling), query_ids.long())


def subagent_advantages(query_index: Tensor, rollout_index: Tensor, rewards: Tensor, *,
                        num_rollouts: int, d: int, generator: torch.Generator,
                        scale: Scale = "std", eps: float = 1e-6,
                        dynamic_sampling: bool = False) -> AlignedAdvantages:
    """M-GRPO advantages of one sub-agent type (Eq. 9-13), for a batch of queries.

    Aligns each query's sub-trajectories to d slots per rollout (:func:`align_batch`), then
    per query: ``mu, sigma`` over its unmasked d*K slots (duplicates counted once per slot) and
    ``A_slot = (R_S - mu) / (sigma + eps)``. Train on slot ``s`` the trajectory
    ``traj_index[s]`` with advantage ``advantages[s]`` where ``keep[s]``.

    Args:
        query_index, rollout_index, rewards: (n,) per sub-trajectory.
        num_rollouts: K. d: slots per rollout (resolve 'auto' with :func:`auto_d` first).
        generator: seeded torch.Generator. scale, eps, dynamic_sampling: as in GRPO.

    Returns:
        AlignedAdvantages with S = (distinct queries) * K * d rows.
    """
    rewards = torch.as_tensor(rewards)
    if rewards.shape != torch.as_tensor(query_index).shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} must have one value per "
                         f"sub-trajectory, like query_index {tuple(query_index.shape)}")
    slots: AlignedSlots = align_batch(query_index, rollout_index, num_rollouts, d,
                                      generator=generator)
    real = slots.weight > 0
    # Masked slots have traj_index -1; gather from a padded copy so they read 0.
    padded = torch.cat([rewards, torch.zeros(1, dtype=rewards.dtype)])
    slot_rewards = padded[torch.where(real, slots.traj_index, len(rewards))]
    adv = group_advantages(slot_rewards, slots.group_ids, scale=scale, eps=eps, mask=real)
    keep = _keep(slot_rewards, slots.group_ids, dynamic_sampling, real)
    return AlignedAdvantages(*slots, slot_rewards, adv, keep)


def mgrpo_advantages(planner_rewards: Tensor, planner_query_ids: Tensor,
                     subagents: Mapping[str, SubagentRollouts], *, num_rollouts: int,
                     d: int | str | Mapping[str, int | str], generator: torch.Generator,
                     scale: Scale = "std", eps: float = 1e-6, dynamic_sampling: bool = False,
                     d_quantile: float = 0.99) -> MGRPOAdvantages:
    """M-GRPO (Hong et al. 2025, Eq. 6-13): planner and every sub-agent type at once.

    Args:
        planner_rewards, planner_query_ids: (N,) one per planner trajectory (N = B*K).
        subagents: sub-agent type -> its SubagentRollouts.
        num_rollouts: K. d: an int, "auto" (99th percentile of this batch's d_k, see
            :func:`auto_d`), or a mapping per sub-agent type of either.
        generator: seeded torch.Generator, consumed in sorted sub-agent-type order.

    Returns:
        MGRPOAdvantages: planner GroupAdvantages, per-type AlignedAdvantages, the d used.
    """
    planner = planner_advantages(planner_rewards, planner_query_ids, scale=scale, eps=eps,
                                 dynamic_sampling=dynamic_sampling)
    out: dict[str, AlignedAdvantages] = {}
    used: dict[str, int] = {}
    for name in sorted(subagents):
        batch = subagents[name]
        d_name = d[name] if isinstance(d, Mapping) else d
        if d_name == "auto":
            d_name = auto_d(call_counts(batch.query_index, batch.rollout_index,
                                        planner_query_ids, num_rollouts), d_quantile)
        used[name] = int(d_name)
        out[name] = subagent_advantages(batch.query_index, batch.rollout_index, batch.rewards,
                                        num_rollouts=num_rollouts, d=used[name],
                                        generator=generator, scale=scale, eps=eps,
                                        dynamic_sampling=dynamic_sampling)
    return MGRPOAdvantages(planner, out, used)


def call_counts(query_index: Tensor, rollout_index: Tensor, query_ids: Tensor,
                num_rollouts: int) -> Tensor:
    """d_k for every (query, rollout) of the batch, zeros included: input of :func:`auto_d`.

    query_index, rollout_index: (n,) per sub-trajectory; query_ids: the batch's query ids
    (any shape, duplicates allowed). Returns (Q*K,) long, Q = distinct queries.
    """
    queries = torch.unique(torch.as_tensor(query_ids).long().flatten())
    counts = torch.zeros(queries.numel(), num_rollouts, dtype=torch.long)
    query_index = torch.as_tensor(query_index).long()
    rows = torch.searchsorted(queries, query_index).clamp(max=max(queries.numel() - 1, 0))
    if query_index.numel() and (queries.numel() == 0 or (queries[rows] != query_index).any()):
        raise ValueError("every sub-trajectory's query_index must be one of the planner's "
                         "query ids; a sub-agent call without its planner rollout is orphaned")
    counts.index_put_((rows, torch.as_tensor(rollout_index).long()),
                      torch.ones_like(rows), accumulate=True)
    return counts.flatten()


# Which of (query, agent, turn) key a group, by grouping name: AT-GRPO's agent- and
# turn-wise groups, or a naive GRPO's coarser ones (across turns, across roles, or both).
GROUPINGS: dict[str, tuple[bool, bool]] = {  # name -> (agent in key, turn in key)
    "agent_turn": (True, True), "agent": (True, False), "turn": (False, True),
    "naive": (False, False)}


def at_grpo_group_ids(query_ids: Tensor, agent_ids: Tensor, turn_ids: Tensor,
                      grouping: str = "agent_turn") -> Tensor:
    """Dense group id per sample, (N,) long in [0, G): the key (query, agent, turn) of
    AT-GRPO (``grouping="agent_turn"``), (query, agent) (``"agent"``: one group across a
    role's turns), (query, turn) (``"turn"``: one group across roles) or (query) alone
    (``"naive"``: one group across roles and turns). Ids follow the keys' sorted order."""
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping {grouping!r}: choose among {sorted(GROUPINGS)}")
    by_agent, by_turn = GROUPINGS[grouping]
    query = torch.as_tensor(query_ids).long()
    parts = [query,
             torch.as_tensor(agent_ids).long() if by_agent else torch.zeros_like(query),
             torch.as_tensor(turn_ids).long() if by_turn else torch.zeros_like(query)]
    return torch.unique(torch.stack(parts, 1), dim=0, return_inverse=True)[1]


def at_grpo_advantages(rewards: Tensor, query_ids: Tensor, agent_ids: Tensor,
                       turn_ids: Tensor, *, scale: Scale = "std", eps: float = 1e-6,
                       dynamic_sampling: bool = False,
                       grouping: str = "agent_turn") -> GroupAdvantages:
    """AT-GRPO (Stronger-MAS, Zhao et al. 2025): GRPO with group key (query, agent, turn).

    rewards (N,) turn rewards ``alpha*r_team + r_local`` of the K candidates sampled from the
    same state; query_ids, agent_ids, turn_ids (N,) long. Returns GroupAdvantages whose
    ``group_ids`` are the dense group indices of ``grouping`` (:func:`at_grpo_group_ids`;
    anything but ``agent_turn`` is the naive multi-agent GRPO the paper compares against).
    """
    group_ids = at_grpo_group_ids(query_ids, agent_ids, turn_ids, grouping)
    adv = group_advantages(rewards, group_ids, scale=scale, eps=eps)
    return GroupAdvantages(adv, _keep(rewards, group_ids, dynamic_sampling), group_ids)
