"""Sampler/trainer mismatch and truncated importance sampling (mgrpo.algo.rollout_correction),
against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo.algo import policy_loss, rollout_is_weights, rollout_mismatch

TRAIN = torch.tensor([[0.0, -1.0, -2.0]])
ROLLOUT = torch.tensor([[0.0, -1.5, -1.0]])
MASK = torch.tensor([[0, 1, 1]])


def test_mismatch_mean_max_and_kl_by_hand():
    # d = train - rollout = [0.5, -1.0] on the two generated tokens
    out = rollout_mismatch(TRAIN, ROLLOUT, MASK)
    assert out["logp_diff_mean"] == pytest.approx(0.75)
    assert out["logp_diff_max"] == pytest.approx(1.0)
    k3 = ((math.exp(0.5) - 0.5 - 1) + (math.exp(-1.0) + 1.0 - 1)) / 2  # 0.2583003
    assert out["rollout_kl"] == pytest.approx(k3) and k3 == pytest.approx(0.2583003, abs=1e-7)


def test_mismatch_is_zero_when_engines_agree_and_on_an_empty_mask():
    assert rollout_mismatch(TRAIN, TRAIN, MASK) == {"logp_diff_mean": 0.0,
                                                   "logp_diff_max": 0.0, "rollout_kl": 0.0}
    garbage = ROLLOUT.clone()
    garbage[0, 0] = float("-inf")  # a masked position never counts
    assert rollout_mismatch(TRAIN, garbage, torch.zeros_like(MASK))["logp_diff_max"] == 0.0
    assert rollout_mismatch(TRAIN, garbage, MASK)["logp_diff_max"] == pytest.approx(1.0)


def test_token_weights_are_truncated_ratios_and_zero_on_masked_tokens():
    w = rollout_is_weights(TRAIN, ROLLOUT, MASK, "token", threshold=2.0)
    assert w.tolist()[0] == pytest.approx([0.0, math.exp(0.5), math.exp(-1.0)])
    w = rollout_is_weights(TRAIN, ROLLOUT, MASK, "token", threshold=1.5)
    assert w.tolist()[0] == pytest.approx([0.0, 1.5, math.exp(-1.0)])  # e^0.5 = 1.6487 capped


def test_sequence_weight_is_the_product_of_token_ratios_then_truncated():
    w = rollout_is_weights(TRAIN, ROLLOUT, MASK, "sequence", threshold=2.0)
    assert w.tolist()[0] == pytest.approx([0.0, math.exp(-0.5), math.exp(-0.5)])  # 0.5 - 1.0
    far = rollout_is_weights(torch.tensor([[-0.1, -0.1]]), torch.tensor([[-30.0, -30.0]]),
                             torch.ones(1, 2), "sequence", threshold=3.0)
    assert far.tolist() == [[3.0, 3.0]]  # exp(59.8) -> safety bound exp(20) -> cap 3
    assert rollout_is_weights(TRAIN, ROLLOUT, MASK, "none") is None


def test_bad_threshold_and_level_are_refused():
    with pytest.raises(ValueError, match="rollout_is_threshold=0.5 must be >= 1"):
        rollout_is_weights(TRAIN, ROLLOUT, MASK, "token", threshold=0.5)
    with pytest.raises(ValueError, match="rollout_is='geo'"):
        rollout_is_weights(TRAIN, ROLLOUT, MASK, "geo")


def test_weights_scale_the_policy_gradient_term_per_token():
    # rho = 1, A = 1, token-mean over 2 tokens: loss = -(w1 + w2) / 2, dloss/dlogp_t = -w_t / 2
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach().clone(), torch.tensor([1.0]), torch.ones(1, 2),
                          is_weights=torch.tensor([[2.0, 0.5]]))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.25)
    assert logp.grad.tolist() == [pytest.approx([-1.0, -0.25])]
