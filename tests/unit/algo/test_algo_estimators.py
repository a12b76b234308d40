"""The estimator registry (one signature: batch, config -> advantages) and the M-GRPO /
AT-GRPO estimators, with hand-computed K = 4 cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mgrpo.algo import (
    AdvantageBatch,
    Alignment,
    EstimatorConfig,
    SubagentRollouts,
    advantages_from_stats,
    align_batch,
    auto_d,
    call_counts,
    estimator_names,
    get_estimator,
    group_stats,
    mgrpo_advantages,
    register_estimator,
    subagent_advantages,
)

SQRT3 = math.sqrt(3.0)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(rewards, queries, agents=None, turns=None, rollouts=None, alignment=None):
    zeros = torch.zeros(len(rewards), dtype=torch.long)
    return AdvantageBatch(rewards, queries, zeros if agents is None else agents,
                          zeros if turns is None else turns,
                          zeros if rollouts is None else rollouts, alignment)


def test_registry_has_the_four_estimators_and_lists_them_on_error():
    assert estimator_names() == ["at_grpo", "dr_grpo", "grpo", "mgrpo"]
    with pytest.raises(ValueError, match=r"'ppo'; valid: at_grpo, dr_grpo, grpo, mgrpo \("):
        get_estimator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda batch, config: None)


def test_grpo_and_dr_grpo_hand_computed_k4_with_dapo_filter():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = get_estimator("grpo")(batch(rewards, groups), EstimatorConfig(dynamic_sampling=True))
    assert out.advantages.tolist() == pytest.approx(
        [SQRT3, -1 / SQRT3, -1 / SQRT3, -1 / SQRT3, 0, 0, 0, 0], abs=1e-5)
    assert out.keep.tolist() == [True] * 4 + [False] * 4  # all-correct group dropped
    assert out.sample.tolist() == list(range(8)) and torch.equal(out.rewards, rewards)
    dr = get_estimator("dr_grpo")(batch(rewards, groups), EstimatorConfig())
    assert dr.advantages.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    assert dr.keep.all()
    # grpo takes loss.scale: none is Dr. GRPO's
    same = get_estimator("grpo")(batch(rewards, groups), EstimatorConfig(scale="none"))
    assert torch.equal(same.advantages, dr.advantages)


def subagent_case():
    """One query (id 4), K = 4, d = 2.

    rollout 0: 2 calls (= d), rewards 0.6, 1.0  -> both, once each
    rollout 1: no call                           -> 2 masked slots
    rollout 2: 3 calls (> d), all reward 0.1     -> 2 of them (either way 0.1, 0.1)
    rollout 3: 1 call (< d), reward 0.5          -> it, twice
    Unmasked slots: 0.6, 1.0, 0.1, 0.1, 0.5, 0.5 (duplicate counted, masked left out):
    mu = 2.8 / 6 = 0.466667, sigma = sqrt(0.573333 / 6) = 0.309121,
    A = (0.431331, 1.725324, -1.186161, -1.186161, 0.107833, 0.107833).
    """
    rollout = torch.tensor([0, 0, 2, 2, 2, 3])
    rewards = torch.tensor([0.6, 1.0, 0.1, 0.1, 0.1, 0.5])
    return torch.full((6,), 4), rollout, rewards


def test_subagent_advantages_hand_computed_k4():
    query, rollout, rewards = subagent_case()
    out = subagent_advantages(query, rollout, rewards, num_rollouts=4, d=2, generator=gen())
    assert out.weight.tolist() == [1, 1, 0, 0, 1, 1, 1, 1]
    assert out.rewards.tolist() == pytest.approx([0.6, 1.0, 0, 0, 0.1, 0.1, 0.5, 0.5])
    expected = [0.431331, 1.725324, 0, 0, -1.186161, -1.186161, 0.107833, 0.107833]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-5)
    assert out.keep.tolist() == [True, True, False, False, True, True, True, True]
    assert out.group_ids.tolist() == [4] * 8
    assert out.traj_index[6:].tolist() == [5, 5]  # trained twice, same advantage


def test_mgrpo_estimator_runs_planner_and_subagents():
    # Planner: query 4 with K = 4 rewards (0.1, 1.0, 0.0, 1.0): mu = 0.525,
    # sigma = sqrt((0.180625 + 0.225625 + 0.275625 + 0.225625) / 4) = 0.476314.
    planner_rewards = torch.tensor([0.1, 1.0, 0.0, 1.0])
    planner_queries = torch.full((4,), 4)
    query, rollout, rewards = subagent_case()
    out = mgrpo_advantages(planner_rewards, planner_queries,
                           {"searcher": SubagentRollouts(query, rollout, rewards)},
                           num_rollouts=4, d="auto", generator=gen())
    sigma = math.sqrt((0.425**2 + 0.475**2 + 0.525**2 + 0.475**2) / 4)
    assert sigma == pytest.approx(0.476314, abs=1e-6)
    assert out.planner.advantages.tolist() == pytest.approx(
        [-0.425 / sigma, 0.475 / sigma, -0.525 / sigma, 0.475 / sigma], abs=1e-5)
    # d_k = (2, 0, 3, 1): inverted-CDF 99th percentile is 3.
    assert out.d == {"searcher": 3}
    searcher = out.subagents["searcher"]
    assert searcher.weight.tolist() == [1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert torch.equal(searcher.weight > 0, searcher.keep)


def test_the_mgrpo_estimator_aligns_a_subagent_batch_and_groups_a_planner_batch():
    query, rollout, rewards = subagent_case()
    queries = torch.zeros(6, dtype=torch.long)  # the dense index of query 4
    side = get_estimator("mgrpo")(batch(rewards, queries, rollouts=rollout,
                                        alignment=Alignment(num_rollouts=4, d=2, seed=0)),
                                  EstimatorConfig())
    direct = subagent_advantages(queries, rollout, rewards, num_rollouts=4, d=2,
                                 generator=gen())
    assert torch.equal(side.advantages, direct.advantages)
    assert side.sample.tolist() == direct.traj_index.tolist()  # -1 on the masked slots
    assert torch.equal(side.keep, direct.keep) and torch.equal(side.rewards, direct.rewards)
    planner = get_estimator("mgrpo")(batch(rewards, queries), EstimatorConfig())
    assert torch.equal(planner.advantages,
                       get_estimator("grpo")(batch(rewards, queries), EstimatorConfig()).advantages)


def test_call_counts_include_rollouts_without_calls():
    counts = call_counts(torch.tensor([4, 4, 9]), torch.tensor([0, 0, 1]),
                         torch.tensor([4, 4, 9, 9]), num_rollouts=2)
    assert counts.tolist() == [2, 0, 0, 1]
    with pytest.raises(ValueError, match="orphaned"):
        call_counts(torch.tensor([5]), torch.tensor([0]), torch.tensor([4]), num_rollouts=2)


def test_at_grpo_groups_by_query_agent_turn_hand_computed_k4():
    # Two groups of K = 4 candidates, interleaved: (q0, agent 0, turn 0) gets (1, 0, 0, 0),
    # (q0, agent 1, turn 0) gets (0.1, 1, 1, 0.1). Same query and turn, different agent.
    rewards = torch.tensor([1.0, 0.1, 0.0, 1.0, 0.0, 1.0, 0.0, 0.1])
    agents = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    out = get_estimator("at_grpo")(batch(rewards, torch.zeros(8, dtype=torch.long), agents),
                                   EstimatorConfig())
    expected = [SQRT3, -1.0, -1 / SQRT3, 1.0, -1 / SQRT3, 1.0, -1 / SQRT3, -1.0]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-5)
    assert out.group_ids.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    none = get_estimator("at_grpo")(batch(rewards, torch.zeros(8, dtype=torch.long), agents,
                                          torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])),
                                    EstimatorConfig(scale="none"))
    # now four groups of two: (1, 0) | (0.1, 1) | (0, 0) | (1, 0.1)
    assert none.advantages.tolist() == pytest.approx(
        [0.5, -0.45, -0.5, 0.45, 0.0, 0.45, 0.0, -0.45], abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_auto_d_matches_numpy_inverted_cdf(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 8, size=int(rng.integers(1, 300)))
    for q in (0.5, 0.9, 0.99, 1.0):
        want = max(1, int(np.quantile(counts, q, method="inverted_cdf")))
        assert auto_d(torch.tensor(counts), q) == want


def loop_subagent_advantages(rewards, slot_index, eps=1e-6):
    """Reference: per query, mean/pstd over the real slots by hand."""
    vals = [rewards[i] for i in slot_index if i >= 0]
    if not vals:
        return [0.0] * len(slot_index)
    mu = sum(vals) / len(vals)
    sigma = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
    if max(vals) == min(vals):
        return [0.0] * len(slot_index)
    return [(rewards[i] - mu) / (sigma + eps) if i >= 0 else 0.0 for i in slot_index]


@pytest.mark.parametrize("seed", range(6))
def test_subagent_advantages_match_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 30, (1,), generator=g))
    k = int(torch.randint(1, 5, (1,), generator=g))
    query = torch.randint(0, 3, (n,), generator=g)
    rollout = torch.randint(0, k, (n,), generator=g)
    rewards = torch.randint(0, 4, (n,), generator=g).double() / 3
    d = int(torch.randint(1, 4, (1,), generator=g))
    out = subagent_advantages(query, rollout, rewards, num_rollouts=k, d=d, generator=gen(seed))
    for q in torch.unique(query).tolist():
        rows = out.group_ids == q
        want = loop_subagent_advantages(rewards.tolist(), out.traj_index[rows].tolist())
        assert out.advantages[rows].tolist() == pytest.approx(want, abs=1e-9)


def test_distributed_flow_equals_subagent_advantages():
    # Trainer steps with a publish in between: align -> group_stats -> (store) -> advantages.
    query, rollout, rewards = subagent_case()
    one_shot = subagent_advantages(query, rollout, rewards, num_rollouts=4, d=2,
                                   generator=gen(5))
    slots = align_batch(query, rollout, num_rollouts=4, d=2, generator=gen(5))
    real = slots.weight > 0
    slot_rewards = torch.where(real, rewards[slots.traj_index.clamp(min=0)], 0.0)
    published = group_stats(slot_rewards, slots.group_ids, mask=real)
    assert published.count.tolist() == [6]  # duplicates counted, masked slots not
    adv = advantages_from_stats(slot_rewards, slots.group_ids, published, mask=real)
    assert torch.equal(adv, one_shot.advantages)
    assert torch.equal(slots.traj_index, one_shot.traj_index)
