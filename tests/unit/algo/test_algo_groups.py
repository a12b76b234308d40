"""Group statistics, GRPO / Dr. GRPO advantages, the DAPO filter, greedy choice.

Hand-computed K = 4 cases, hypothesis properties, and a plain-loop reference.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo import (
    GroupStats,
    advantages_from_stats,
    dynamic_sampling_mask,
    greedy_choice,
    group_advantages,
    group_stats,
)

SQRT3 = math.sqrt(3.0)

# Two queries, K = 4. Query 7: one correct of four (1, 0, 0, 0): mu = 0.25, sigma = sqrt(3)/4.
# Query 3: planner rewards with the format gate (0.1 = valid but wrong, 1.0 = correct):
# mu = 0.55, sigma = 0.45.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.1, 1.0, 1.0, 0.1])
GROUPS = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3])


def test_group_stats_hand_computed_k4():
    ids, count, mean, std = group_stats(REWARDS, GROUPS)
    assert ids.tolist() == [3, 7]  # ascending id order
    assert count.tolist() == [4, 4]
    assert mean.tolist() == pytest.approx([0.55, 0.25], abs=1e-7)
    assert std.tolist() == pytest.approx([0.45, SQRT3 / 4], abs=1e-7)  # population, 1/K


def test_grpo_advantages_hand_computed_k4():
    adv = group_advantages(REWARDS, GROUPS, scale="std", eps=1e-6)
    expected = [SQRT3, -1 / SQRT3, -1 / SQRT3, -1 / SQRT3, -1.0, 1.0, 1.0, -1.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)


def test_dr_grpo_advantages_hand_computed_k4():
    adv = group_advantages(REWARDS, GROUPS, scale="none")
    expected = [0.75, -0.25, -0.25, -0.25, -0.45, 0.45, 0.45, -0.45]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_masked_samples_are_left_out_of_the_statistics():
    # Slot 3 masked: the group is (1, 0, 0) -> mu = 1/3, sigma = sqrt(2)/3.
    mask = torch.tensor([True, True, True, False])
    rewards = torch.tensor([1.0, 0.0, 0.0, 123.0])
    stats = group_stats(rewards, torch.zeros(4, dtype=torch.long), mask)
    assert stats.count.tolist() == [3]
    assert stats.mean.item() == pytest.approx(1 / 3)
    assert stats.std.item() == pytest.approx(math.sqrt(2) / 3)
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long), mask=mask)
    assert adv[3].item() == 0.0
    assert adv[0].item() == pytest.approx((2 / 3) / (math.sqrt(2) / 3), abs=1e-5)


def test_equal_rewards_give_exactly_zero_even_when_the_float_mean_rounds():
    # sum(3 x 0.1) / 3 != 0.1 in floating point; the advantage must still be exactly 0.
    rewards = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    ids = torch.zeros(3, dtype=torch.long)
    assert sum([0.1, 0.1, 0.1]) / 3 != 0.1
    for scale in ("std", "none"):
        assert group_advantages(rewards, ids, scale=scale).tolist() == [0.0, 0.0, 0.0]
    assert group_stats(rewards, ids).std.item() == 0.0


def test_advantages_from_stats_matches_after_a_store_round_trip():
    stats = group_stats(REWARDS, GROUPS)
    # What the store gives back: Python floats (double precision), rows in another order.
    as_f64 = dict(dtype=torch.float64)
    stored = GroupStats(torch.tensor([7, 3]), torch.tensor([4, 4]),
                        torch.tensor([stats.mean[1].item(), stats.mean[0].item()], **as_f64),
                        torch.tensor([stats.std[1].item(), stats.std[0].item()], **as_f64))
    for scale in ("std", "none"):
        direct = group_advantages(REWARDS, GROUPS, scale=scale)
        assert torch.equal(advantages_from_stats(REWARDS, GROUPS, stored, scale=scale), direct)


def test_advantages_from_stats_rejects_a_group_without_statistics():
    stats = group_stats(REWARDS[:4], GROUPS[:4])
    with pytest.raises(ValueError, match=r"groups \[3\].*no statistics"):
        advantages_from_stats(REWARDS, GROUPS, stats)


def test_bad_inputs_are_rejected_with_the_value():
    with pytest.raises(ValueError, match="scale='zscore'"):
        group_advantages(REWARDS, GROUPS, scale="zscore")
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(REWARDS, GROUPS.float())


def test_dynamic_sampling_mask_drops_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.1])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    keep = dynamic_sampling_mask(rewards, groups)
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4


def test_greedy_choice_picks_the_best_and_breaks_ties_by_lowest_index():
    rewards = torch.tensor([0.2, 0.9, 0.9, 0.1, 0.5, 0.5, 0.5, 0.7])
    groups = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0])
    # group 0 (indices 4..7): best 0.7 at 7; group 1 (0..3): tie 0.9 at 1 and 2 -> 1.
    assert greedy_choice(rewards, groups).tolist() == [7, 1]
    assert greedy_choice(torch.tensor([0.3, 0.3]), torch.tensor([5, 5])).tolist() == [0]


# ---------- plain-loop reference ----------

def loop_group_advantages(rewards: list[float], groups: list[int], scale: str, eps: float):
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        mu = statistics.fmean(members)
        sigma = statistics.pstdev(members)
        if max(members) == min(members):
            out.append(0.0)
        elif scale == "std":
            out.append((r - mu) / (sigma + eps))
        else:
            out.append(r - mu)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("scale", ["std", "none"])
def test_vectorised_matches_loop_reference(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (1,), generator=gen))
    groups = torch.randint(0, 6, (n,), generator=gen) * 3 - 4  # sparse, negative ids too
    rewards = torch.randint(0, 5, (n,), generator=gen).double() / 4  # ties are common
    got = group_advantages(rewards, groups, scale=scale, eps=1e-6)
    want = loop_group_advantages(rewards.tolist(), groups.tolist(), scale, 1e-6)
    assert got.tolist() == pytest.approx(want, abs=1e-9)


# ---------- properties ----------

reward_values = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.55, 0.9, 1.0])
batches = st.integers(1, 5).flatmap(lambda g: st.tuples(
    st.lists(reward_values, min_size=1, max_size=24),
    st.lists(st.integers(0, g), min_size=24, max_size=24)))


@settings(max_examples=50, deadline=None)
@given(batches, st.sampled_from(["std", "none"]))
def test_advantages_are_zero_mean_per_group(batch, scale):
    values, ids = batch
    rewards = torch.tensor(values, dtype=torch.float64)
    groups = torch.tensor(ids[:len(values)])
    adv = group_advantages(rewards, groups, scale=scale)
    for g in torch.unique(groups).tolist():
        assert abs(adv[groups == g].sum().item()) < 1e-9


@settings(max_examples=50, deadline=None)
@given(batches, st.floats(-10, 10), st.sampled_from(["std", "none"]))
def test_adding_a_constant_to_all_rewards_changes_nothing(batch, shift, scale):
    values, ids = batch
    rewards = torch.tensor(values, dtype=torch.float64)
    groups = torch.tensor(ids[:len(values)])
    base = group_advantages(rewards, groups, scale=scale)
    shifted = group_advantages(rewards + shift, groups, scale=scale)
    assert torch.allclose(base, shifted, atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(st.floats(-1e6, 1e6), st.integers(1, 16), st.sampled_from(["std", "none"]),
       st.sampled_from([torch.float32, torch.float64]))
def test_equal_rewards_give_zero_and_never_nan(value, k, scale, dtype):
    rewards = torch.full((k,), value, dtype=dtype)
    adv = group_advantages(rewards, torch.zeros(k, dtype=torch.long), scale=scale)
    assert adv.dtype == dtype
    assert adv.tolist() == [0.0] * k
