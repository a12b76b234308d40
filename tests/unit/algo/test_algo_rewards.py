"""Reward composition with the format gate (Eq. 4-5; docs/algorithm.md, '1.2 Rewards') and the
AT-GRPO turn reward."""

from __future__ import annotations

import pytest
import torch

from mgrpo.algo import mix_turn_reward, planner_reward, subagent_reward


def test_planner_reward_scalar_cases():
    assert planner_reward(True, 1.0) == pytest.approx(1.0)  # 0.1 + 0.9
    assert planner_reward(True, 0.0) == pytest.approx(0.1)  # valid format, wrong answer
    assert planner_reward(False, 1.0) == 0.0  # the gate: a correct answer in a bad format
    assert planner_reward(True, 0.5, weights=(0.2, 0.8)) == pytest.approx(0.6)
    assert isinstance(planner_reward(True, 1.0), float)


def test_planner_reward_vectorised_k4():
    rewards = planner_reward(torch.tensor([True, True, False, True]),
                             torch.tensor([1.0, 0.0, 1.0, 0.5]))
    assert rewards.tolist() == pytest.approx([1.0, 0.1, 0.0, 0.55])
    assert rewards.dtype == torch.float32
    assert planner_reward([1, 0], [1.0, 1.0]).tolist() == pytest.approx([1.0, 0.0])


def test_subagent_reward_cases():
    # 0.1 + 0.4 * r_correct_main + 0.5 * r_expert, gated on the sub-agent's own format.
    assert subagent_reward(True, 1.0, 1.0) == pytest.approx(1.0)
    assert subagent_reward(True, 0.0, 1.0) == pytest.approx(0.6)
    assert subagent_reward(True, 1.0, 0.0) == pytest.approx(0.5)
    assert subagent_reward(False, 1.0, 1.0) == 0.0
    got = subagent_reward(torch.tensor([True, True, False, True]),
                          torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.5, 0.5, 1.0, 0.0]))
    assert got.tolist() == pytest.approx([0.75, 0.35, 0.0, 0.1])


def test_reward_inputs_are_validated():
    with pytest.raises(ValueError, match=r"correct must lie in \[0, 1\], got \[2.0\]"):
        planner_reward(True, 2.0)
    with pytest.raises(ValueError, match="expert must lie"):
        subagent_reward(True, 1.0, -0.5)
    with pytest.raises(ValueError, match="sub-agent weights must be 3"):
        subagent_reward(True, 1.0, 1.0, weights=(0.5, 0.5))
    with pytest.raises(ValueError, match="finite"):
        planner_reward(True, float("nan"))


def test_mix_turn_reward():
    assert mix_turn_reward(1.0, 0.5, alpha=2.0) == pytest.approx(2.5)
    assert mix_turn_reward(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]),
                           alpha=0.5).tolist() == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError, match="alpha=-1"):
        mix_turn_reward(1.0, 1.0, alpha=-1)
