"""The math of M-GRPO and AT-GRPO: pure tensor functions (torch, numpy, pydantic only).

- ``rewards``: reward composition with the format gate (Eq. 4-5, docs/algorithm.md), AT-GRPO turn
  reward
- ``groups``: group statistics, group-relative advantages, DAPO filter, greedy choice
- ``alignment``: sub-agent trajectory alignment to d slots per rollout, auto d
- ``advantages``: the advantage math of GRPO, Dr. GRPO, M-GRPO (alignment) and AT-GRPO
- ``estimators``: the estimator registry, one signature (``grpo``, ``dr_grpo``, ``mgrpo``,
  ``at_grpo``)
- ``algorithms``: the algorithm registry (``mgrpo``, ``at_grpo``, ``grpo``)
- ``loss``: token-level clipped policy loss, the one aggregation function
- ``schedules``: learning-rate schedules (constant, linear, cosine) with warm-up
- ``kl``: the KL estimators k1, k2, k3, k1+, k3+ (values, gradients, KL in the reward)
- ``kl_control``: the KL-in-reward coefficient, fixed or adaptive toward a target KL
- ``rollout_correction``: sampler/trainer logprob mismatch, truncated importance weights
- ``paired``: paired bootstrap interval of the accuracy difference of two systems (ablations)
- ``vocab_logprobs``: log-probability of each label and the entropy over a large vocabulary,
  chunked by positions (and its plain reference)

No I/O, no store, no bus, no model code. See ``docs/algorithm.md`` for equation -> function.
"""

from mgrpo.algo.advantages import (
    AlignedAdvantages,
    GroupAdvantages,
    MGRPOAdvantages,
    SubagentRollouts,
    at_grpo_advantages,
    at_grpo_group_ids,
    call_counts,
    dr_grpo_advantages,
    grpo_advantages,
    mgrpo_advantages,
    planner_advantages,
    subagent_advantages,
)
from mgrpo.algo.alignment import AlignedSlots, align_batch, align_subagents, auto_d
from mgrpo.algo.estimators import (
    AdvantageBatch,
    Advantages,
    Alignment,
    EstimatorConfig,
    estimator_names,
    get_estimator,
    register_estimator,
)
from mgrpo.algo.groups import (
    GroupStats,
    advantages_from_stats,
    dynamic_sampling_mask,
    greedy_choice,
    group_advantages,
    group_stats,
)
from mgrpo.algo.kl import (
    KL_ESTIMATORS,
    KL_LOSS_ESTIMATORS,
    kl_penalty,
    kl_value,
    sequence_kl_penalty,
)
from mgrpo.algo.loss import AGG_MODES, aggregate_loss, kl_divergence, policy_loss
from mgrpo.algo.rewards import (
    PLANNER_WEIGHTS,
    SUBAGENT_WEIGHTS,
    mix_turn_reward,
    planner_reward,
    subagent_reward,
)
from mgrpo.algo.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    rollout_is_weights,
    rollout_mismatch,
)
from mgrpo.algo.schedules import LR_SCHEDULES, lr_at

__all__ = [
    "AGG_MODES", "KL_ESTIMATORS", "KL_LOSS_ESTIMATORS", "LR_SCHEDULES", "PLANNER_WEIGHTS",
    "ROLLOUT_IS_LEVELS", "SUBAGENT_WEIGHTS",
    "AdvantageBatch", "Advantages", "AlignedAdvantages", "AlignedSlots", "Alignment",
    "EstimatorConfig", "GroupAdvantages", "GroupStats", "MGRPOAdvantages",
    "SubagentRollouts",
    "advantages_from_stats", "aggregate_loss", "align_batch", "align_subagents",
    "at_grpo_advantages", "at_grpo_group_ids", "auto_d", "call_counts", "dr_grpo_advantages",
    "dynamic_sampling_mask", "estimator_names", "get_estimator", "greedy_choice",
    "group_advantages", "group_stats", "grpo_advantages", "kl_divergence", "kl_penalty",
    "kl_value", "lr_at", "sequence_kl_penalty", "mgrpo_advantages",
    "mix_turn_reward", "planner_advantages", "planner_reward", "policy_loss",
    "register_estimator", "rollout_is_weights", "rollout_mismatch", "subagent_advantages",
    "subagent_reward",
]
