"""Advantage estimators, registered by name and called with one signature: ``grpo``,
``dr_grpo``, ``mgrpo``, ``at_grpo``.

An estimator is a function ``(batch: AdvantageBatch, config: EstimatorConfig) -> Advantages``
(verl's ``register_adv_est`` / ``get_adv_estimator_fn``): one role's (or one model's) samples
in, one advantage and ``keep`` flag per trained row out. A trainer looks its estimator up by
the run's name for it (the algorithm's ``estimator``, or ``loss.advantage_estimator``) and
calls it; nothing compares estimator names::

    from mgrpo.algo.estimators import register_estimator

    @register_estimator("my_estimator")
    def my_estimator(batch, config):
        ...
        return Advantages.per_sample(batch, advantages, keep, group_ids)

| name      | groups                                                | scale             |
| --------- | ----------------------------------------------------- | ----------------- |
| grpo      | the query                                             | ``config.scale``  |
| dr_grpo   | the query                                             | none              |
| mgrpo     | the query; with ``batch.alignment`` (a sub-agent      | ``config.scale``  |
|           | role) after alignment to d slots per rollout          |                   |
| at_grpo   | ``config.grouping`` of (query, agent, turn)           | ``config.scale``  |

What this module does NOT do: the math (``mgrpo.algo.advantages``), compute rewards, or know
a run config (``mgrpo.training.scoring`` builds the batch and the config from one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from mgrpo.algo.advantages import (
    at_grpo_advantages,
    dr_grpo_advantages,
    planner_advantages,
    subagent_advantages,
)
from mgrpo.algo.groups import Scale
from mgrpo.registry import Registry


@dataclass(frozen=True)
class Alignment:
    """The M-GRPO sub-agent side's alignment: every (query, rollout) of ``num_rollouts`` to
    ``d`` slots, the duplicates and drops drawn with ``seed``."""

    num_rollouts: int
    d: int
    seed: int


@dataclass(frozen=True)
class AdvantageBatch:
    """N samples of one trainer's role (or model): rewards and the ids that may key a group.
    Ids are dense long tensors (query and agent: indices into the caller's sorted keys)."""

    rewards: Tensor  # (N,) float
    query_ids: Tensor  # (N,) long
    agent_ids: Tensor  # (N,) long: the role
    turn_ids: Tensor  # (N,) long: the team turn (AT-GRPO's candidates), 0 where none
    rollout_ids: Tensor  # (N,) long in [0, K)
    alignment: Alignment | None = None  # an M-GRPO sub-agent role's; None elsewhere


@dataclass(frozen=True)
class EstimatorConfig:
    """The loss section's options an estimator reads (each reads the ones it needs)."""

    scale: Scale = "std"  # std: GRPO; none: Dr. GRPO
    eps: float = 1e-6
    dynamic_sampling: bool = False  # DAPO: leave out the groups with equal rewards
    grouping: str = "agent_turn"  # which of (query, agent, turn) key a group (GROUPINGS)


class Advantages(NamedTuple):
    """One row per trained sample (S rows; S = N unless the estimator aligns)."""

    advantages: Tensor  # (S,) float
    keep: Tensor  # (S,) bool: False = leave out of the loss
    group_ids: Tensor  # (S,) long: the group each row was normalised in
    sample: Tensor  # (S,) long: the batch sample the row trains, -1 on a masked slot
    rewards: Tensor  # (S,) float: that sample's reward, 0 on a masked slot

    @classmethod
    def per_sample(cls, batch: AdvantageBatch, advantages: Tensor, keep: Tensor,
                   group_ids: Tensor) -> Advantages:
        """Rows that are the batch's samples, in order (every estimator that does not align)."""
        return cls(advantages, keep, group_ids, torch.arange(len(batch.rewards)),
                   batch.rewards)


Estimator = Callable[[AdvantageBatch, EstimatorConfig], Advantages]

ESTIMATORS: Registry[Estimator] = Registry(
    "advantage estimator", hint="one of your own: @register_estimator(name) in a module named "
    "under `plugins:`, selected with loss.advantage_estimator")
register_estimator = ESTIMATORS.register
get_estimator = ESTIMATORS.get
estimator_names = ESTIMATORS.names


@register_estimator("grpo")
def grpo(batch: AdvantageBatch, config: EstimatorConfig) -> Advantages:
    """GRPO: one group per query, ``(r - mu) / (sigma + eps)`` (``config.scale``: none is
    Dr. GRPO's ``r - mu``)."""
    out = planner_advantages(batch.rewards, batch.query_ids, scale=config.scale,
                             eps=config.eps, dynamic_sampling=config.dynamic_sampling)
    return Advantages.per_sample(batch, *out)


@register_estimator("dr_grpo")
def dr_grpo(batch: AdvantageBatch, config: EstimatorConfig) -> Advantages:
    """Dr. GRPO: one group per query, ``r - mu`` whatever ``config.scale``."""
    out = dr_grpo_advantages(batch.rewards, batch.query_ids, eps=config.eps,
                             dynamic_sampling=config.dynamic_sampling)
    return Advantages.per_sample(batch, *out)


@register_estimator("mgrpo")
def mgrpo(batch: AdvantageBatch, config: EstimatorConfig) -> Advantages:
    """M-GRPO: the planner's samples one group per query (Eq. 6-8); a sub-agent role's
    (``batch.alignment`` set) aligned to d slots per rollout first, one group per query over
    its live slots (Eq. 9-13)."""
    if batch.alignment is None:
        return grpo(batch, config)
    align = batch.alignment
    out = subagent_advantages(batch.query_ids, batch.rollout_ids, batch.rewards,
                              num_rollouts=align.num_rollouts, d=align.d,
                              generator=torch.Generator().manual_seed(align.seed),
                              scale=config.scale, eps=config.eps,
                              dynamic_sampling=config.dynamic_sampling)
    return Advantages(out.advantages, out.keep, out.group_ids, out.traj_index, out.rewards)


@register_estimator("at_grpo")
def at_grpo(batch: AdvantageBatch, config: EstimatorConfig) -> Advantages:
    """AT-GRPO: one group per ``config.grouping`` of (query, agent, turn)."""
    out = at_grpo_advantages(batch.rewards, batch.query_ids, batch.agent_ids, batch.turn_ids,
                             scale=config.scale, eps=config.eps,
                             dynamic_sampling=config.dynamic_sampling,
                             grouping=config.grouping)
    return Advantages.per_sample(batch, *out)
