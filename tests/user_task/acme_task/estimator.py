"""Acme's advantage estimator, as a user writes it: one file, one registration. A fixed
baseline instead of the group mean, ``A = r - 0.5`` for every sample (REINFORCE with a
constant baseline), each query one group. A run config selects it with
``plugins: [acme_task.estimator]`` and ``loss: {advantage_estimator: acme_fixed_baseline}``."""

from __future__ import annotations

import torch

from mgrpo.algo.estimators import AdvantageBatch, Advantages, EstimatorConfig, register_estimator

BASELINE = 0.5


@register_estimator("acme_fixed_baseline")
def fixed_baseline(batch: AdvantageBatch, config: EstimatorConfig) -> Advantages:
    advantages = batch.rewards - BASELINE
    keep = torch.ones_like(batch.rewards, dtype=torch.bool)
    return Advantages.per_sample(batch, advantages, keep, batch.query_ids)
