"""KL estimators (mgrpo.algo.kl): expected values and expected gradients by exact enumeration
over a 6-way softmax, verl's clamp and straight-through, the KL in the reward."""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo.algo import KL_ESTIMATORS, KL_LOSS_ESTIMATORS, kl_penalty, kl_value
from mgrpo.algo.kl import sequence_kl_penalty

LOGITS = torch.tensor([0.3, -1.2, 2.0, 0.0, -0.4, 1.1], dtype=torch.float64)
REF_LOGITS = torch.tensor([1.0, 0.2, -0.5, 0.7, -1.5, 0.4], dtype=torch.float64)


def _expected_gradient(estimator: str) -> torch.Tensor:
    """E_{a~pi}[grad_theta k(a)] = sum_a pi(a) grad_theta k(log pi(a), log ref(a)), summed over
    the whole support: no sampling, so the comparison is exact up to float64 rounding."""
    theta = LOGITS.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, dim=0)
    ref = torch.log_softmax(REF_LOGITS, dim=0)
    weights = logp.detach().exp()  # the sampling distribution carries no gradient in a loss
    per_action = kl_penalty(logp[None], ref[None], estimator)[0]
    (weights * per_action).sum().backward()
    return theta.grad


def _kl_gradient(reverse: bool = False) -> tuple[torch.Tensor, float]:
    theta = LOGITS.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, dim=0)
    ref = torch.log_softmax(REF_LOGITS, dim=0)
    kl = (ref.exp() * (ref - logp)).sum() if reverse else (logp.exp() * (logp - ref)).sum()
    kl.backward()
    return theta.grad, float(kl.detach())


def test_every_loss_estimator_has_the_gradient_of_kl_pi_ref():
    want, _ = _kl_gradient()
    assert want.abs().max() > 0.1  # a non-trivial case
    for name in KL_LOSS_ESTIMATORS:
        assert torch.allclose(_expected_gradient(name), want, atol=1e-12), name


def test_refused_estimators_have_other_gradients():
    """Why k1 and k3 are refused in the loss: k1's expected gradient is 0, k3's is the
    gradient of the reverse KL(pi_ref || pi)."""
    assert set(KL_ESTIMATORS) - set(KL_LOSS_ESTIMATORS) == {"k1", "k3"}
    assert torch.allclose(_expected_gradient("k1"), torch.zeros(6, dtype=torch.float64),
                          atol=1e-12)
    reverse, _ = _kl_gradient(reverse=True)
    assert torch.allclose(_expected_gradient("k3"), reverse, atol=1e-12)
    assert not torch.allclose(reverse, _kl_gradient()[0], atol=1e-3)


def test_expected_values():
    """k1 and k3 (and so k1+, k3+) are unbiased for KL(pi || pi_ref); k2 is not."""
    logp = torch.log_softmax(LOGITS, 0)
    ref = torch.log_softmax(REF_LOGITS, 0)
    _, kl = _kl_gradient()
    for name in ("k1", "k3", "k1+", "k3+"):
        assert float((logp.exp() * kl_value(logp[None], ref[None], name)[0]).sum()) \
            == pytest.approx(kl, abs=1e-12), name
    k2 = float((logp.exp() * kl_value(logp[None], ref[None], "k2")[0]).sum())
    assert abs(k2 - kl) > 1e-3


def test_hand_values_clamp_and_straight_through():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -50.0]])  # x = 0.5, -1, 50
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1,
          min(math.exp(-20) + 20 - 1, 10.0)]  # x clamped to 20, the value to 10 (verl)
    assert kl_value(logp, ref, "k3")[0].tolist() == pytest.approx(k3)
    assert kl_value(logp, ref, "k3+")[0].tolist() == pytest.approx(k3)
    assert kl_penalty(logp, ref, "k1+")[0].tolist() == pytest.approx([0.5, -1.0, 50.0])
    kl_penalty(logp, ref, "k3+").sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.5, -1.0, 50.0])  # k2's: x
    with pytest.raises(ValueError, match="'k4'"):
        kl_value(logp, ref, "k4")


def test_sequence_penalty_sums_masked_tokens():
    logp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, float("nan")]])
    ref = torch.tensor([[0.0, -1.5, -1.0], [0.0, -1.0, 3.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    out = sequence_kl_penalty(logp, ref, mask, "k1", kl_coef=0.1)
    assert out.tolist() == pytest.approx([0.1 * (0.5 - 1.0), 0.1 * 0.5])
    assert not out.requires_grad
