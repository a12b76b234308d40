"""Sub-agent trajectory alignment (docs/algorithm.md, 'Sub-agents: trajectory alignment') and
auto d."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo import align_batch, align_subagents, auto_d


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rollout_index_of(d_ks: list[int]) -> torch.Tensor:
    return torch.tensor([k for k, d_k in enumerate(d_ks) for _ in range(d_k)], dtype=torch.long)


def test_hand_case_k4_d2():
    # Rollout 0 calls twice (= d), 1 never, 2 three times (> d), 3 once (< d).
    rollouts = torch.tensor([0, 0, 2, 2, 2, 3])
    index, weight = align_subagents(rollouts, num_rollouts=4, d=2, generator=gen())
    assert index.shape == (8,) and weight.shape == (8,)
    assert index[0:2].tolist() == [0, 1]  # d_k = d: all, in invocation order
    assert index[2:4].tolist() == [-1, -1] and weight[2:4].tolist() == [0.0, 0.0]  # masked
    picked = index[4:6].tolist()
    assert len(set(picked)) == 2 and set(picked) <= {2, 3, 4}  # 2 distinct of 3
    assert index[6:8].tolist() == [5, 5]  # the only call, duplicated
    assert weight.tolist() == [1, 1, 0, 0, 1, 1, 1, 1]


def test_drops_are_uniform():
    # d_k = 4 > d = 1 over 4000 seeded draws: each call kept about 1/4 of the time.
    g = gen(1)
    counts = torch.zeros(4)
    for _ in range(4000):
        index, _ = align_subagents(torch.zeros(4, dtype=torch.long), 1, 1, generator=g)
        counts[index[0]] += 1
    assert ((counts / 4000 - 0.25).abs() < 0.03).all(), counts


def test_duplicates_are_uniform():
    # d_k = 2 < d = 3: the extra slot duplicates each call about half of the time.
    g = gen(2)
    first = 0
    for _ in range(2000):
        index, _ = align_subagents(torch.zeros(2, dtype=torch.long), 1, 3, generator=g)
        first += int((index == 0).sum()) - 1
    assert abs(first / 2000 - 0.5) < 0.04


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="d=0"):
        align_subagents(torch.tensor([0]), 2, 0, generator=gen())
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        align_subagents(torch.tensor([0, 2]), 2, 1, generator=gen())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=6), st.integers(1, 5),
       st.integers(0, 2**31 - 1))
def test_alignment_properties(d_ks, d, seed):
    k_total = len(d_ks)
    rollouts = rollout_index_of(d_ks)
    index, weight = align_subagents(rollouts, k_total, d, generator=gen(seed))
    assert index.shape == (k_total * d,) and weight.shape == (k_total * d,)  # d slots each
    for k, d_k in enumerate(d_ks):
        slots = index[k * d:(k + 1) * d].tolist()
        members = set(torch.nonzero(rollouts == k).flatten().tolist())
        if d_k == 0:
            assert slots == [-1] * d and weight[k * d:(k + 1) * d].sum() == 0
            continue
        assert weight[k * d:(k + 1) * d].tolist() == [1.0] * d
        assert set(slots) <= members  # a slot never takes another rollout's call
        if d_k <= d:
            assert set(slots) == members  # every real trajectory present
        if d_k >= d:
            assert len(set(slots)) == d  # no repeats
    again, weight_again = align_subagents(rollouts, k_total, d, generator=gen(seed))
    assert torch.equal(index, again) and torch.equal(weight, weight_again)  # same seed


def test_align_batch_maps_back_to_global_indices_and_is_order_independent():
    # Query 5: rollouts (0, 1); query 2: rollout 1 twice. K = 2, d = 1.
    query = torch.tensor([5, 2, 5, 2])
    rollout = torch.tensor([0, 1, 1, 1])
    slots = align_batch(query, rollout, num_rollouts=2, d=1, generator=gen(3))
    assert slots.group_ids.tolist() == [2, 2, 5, 5]  # queries in ascending id order
    assert slots.rollout.tolist() == [0, 1, 0, 1]
    assert slots.traj_index[0].item() == -1 and slots.weight.tolist() == [0, 1, 1, 1]
    assert slots.traj_index[1].item() in (1, 3)
    assert slots.traj_index[2:].tolist() == [0, 2]
    perm = torch.tensor([2, 3, 0, 1])  # same trajectories, listed in another order
    shuffled = align_batch(query[perm], rollout[perm], 2, 1, generator=gen(3))
    assert torch.equal(perm[shuffled.traj_index[2:]], slots.traj_index[2:])


def test_align_batch_empty():
    empty = torch.zeros(0, dtype=torch.long)
    slots = align_batch(empty, empty, num_rollouts=4, d=2, generator=gen())
    assert slots.traj_index.numel() == 0


def test_auto_d_is_the_99th_percentile_at_least_one():
    # 99 of 100 rollouts call at most twice: d = 2 drops nothing for 99%; the outlier 9 is cut.
    counts = torch.tensor([1] * 98 + [2, 9])
    assert auto_d(counts) == 2
    assert auto_d(torch.tensor([1] * 97 + [2, 9, 9])) == 9  # 2% above 2: now d must be 9
    assert auto_d(torch.tensor([0, 0, 0])) == 1  # at least 1
    assert auto_d(torch.tensor([3, 1, 2, 3])) == 3
    assert auto_d(torch.tensor([], dtype=torch.long)) == 1
    assert auto_d(torch.tensor([4, 1, 3, 2]), quantile=0.5) == 2  # min{x : F(x) >= 0.5}
    assert auto_d(torch.tensor([4, 1, 3, 2]), quantile=0.51) == 3
    assert isinstance(auto_d([4, 4]), int)
    with pytest.raises(ValueError, match="quantile=1.5"):
        auto_d(torch.tensor([1]), quantile=1.5)
    with pytest.raises(ValueError, match="non-negative integers"):
        auto_d(torch.tensor([1.5]))
