"""Policy loss (docs/algorithm.md, '1.4 Policy loss'): hand-computed K = 4 cases per aggregation,
KL, masking, gradient."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo import AGG_MODES, KL_ESTIMATORS, aggregate_loss, kl_divergence, policy_loss

# K = 4 sequences of T = 3 tokens; clip range [0.8, 1.28] (eps_low 0.2, eps_high 0.28).
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
RHO = torch.tensor([[1.5, 1.0, 0.8],   # A = 1:   -1.28 (clipped high), -1, -0.8
                    [0.5, 1.2, 99.0],  # A = -1:  0.8 (clipped low), 1.2, masked
                    [2.0, 5.0, 0.01],  # A = 0.5: -0.64 (clipped high), masked, masked
                    [1.0, 1.4, 0.6]])  # A = -0.5: 0.5, 0.7 (not clipped: A < 0), 0.4 (clipped)
# Per-sequence sums over unmasked tokens: -3.08, 2.0, -0.64, 1.6; total -0.12; 9 tokens.
EXPECTED = {
    "token-mean": -0.12 / 9,
    "seq-mean-token-mean": (-3.08 / 3 + 2.0 / 2 - 0.64 / 1 + 1.6 / 3) / 4,  # -0.0333...
    "seq-mean-token-sum-norm": -0.12 / (4 * 3),
}
OLD = torch.full((4, 3), -1.3)


def hand_inputs():
    logprobs = (OLD + RHO.log()).clone().requires_grad_(True)
    return logprobs, OLD.clone(), ADV.clone(), MASK.clone()


@pytest.mark.parametrize("agg", AGG_MODES)
def test_policy_loss_hand_computed_k4(agg):
    logprobs, old, adv, mask = hand_inputs()
    loss, metrics = policy_loss(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.28, agg=agg)
    assert loss.item() == pytest.approx(EXPECTED[agg], abs=1e-6)
    assert metrics["clipfrac_low"] == pytest.approx(2 / 9)  # rho 0.5 and 0.6 with A < 0
    assert metrics["clipfrac_high"] == pytest.approx(2 / 9)  # rho 1.5 and 2.0 with A > 0
    assert metrics["num_tokens"] == 9
    # token-weighted advantage stats: A = (1,1,1, -1,-1, 0.5, -0.5,-0.5,-0.5)
    tokens = [1, 1, 1, -1, -1, 0.5, -0.5, -0.5, -0.5]
    mean = sum(tokens) / 9
    assert metrics["adv_mean"] == pytest.approx(mean)
    assert metrics["adv_std"] == pytest.approx(math.sqrt(sum((a - mean) ** 2 for a in tokens) / 9))
    rhos = [1.5, 1.0, 0.8, 0.5, 1.2, 2.0, 1.0, 1.4, 0.6]
    assert metrics["approx_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in rhos) / 9)
    assert "kl" not in metrics and "entropy" not in metrics


def test_aggregate_loss_hand_computed():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate_loss(loss_mat, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx(
        (1.5 + 4) / 2)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(
        7 / 6)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm",
                          norm_length=10).item() == pytest.approx(7 / 20)
    # Dr. GRPO with a constant L: padding the batch wider (a longer prompt elsewhere) does
    # not change the loss; without it the normaliser B*T grows with the padding.
    pad = torch.nn.functional.pad
    wide, wide_mask = pad(loss_mat, (0, 5)), pad(mask, (0, 5))
    assert aggregate_loss(wide, wide_mask, "seq-mean-token-sum-norm",
                          norm_length=10).item() == pytest.approx(7 / 20)
    assert aggregate_loss(wide, wide_mask, "seq-mean-token-sum-norm").item() == pytest.approx(
        7 / 16)
    # A sequence with no token (dropped by DAPO) is left out of the sequence mean.
    mask_dropped = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert aggregate_loss(loss_mat, mask_dropped, "seq-mean-token-mean").item() == 1.5
    empty = torch.zeros(2, 3)
    for mode in AGG_MODES:
        assert aggregate_loss(loss_mat, empty, mode).item() == 0.0
    with pytest.raises(ValueError, match=r"'token-sum'.*token-mean"):
        aggregate_loss(loss_mat, mask, "token-sum")


def test_kl_estimators_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])  # x = logp - ref = (0.5, -1)
    assert kl_divergence(logp, ref, "k1").tolist() == [[0.5, -1.0]]
    assert kl_divergence(logp, ref, "k2").tolist() == [[0.125, 0.5]]
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1]  # exp(ref-logp) - (ref-logp) - 1
    assert kl_divergence(logp, ref, "k3")[0].tolist() == pytest.approx(k3)
    with pytest.raises(ValueError, match="'k4'"):
        kl_divergence(logp, ref, "k4")
    # In the loss: A = 0 and rho = 1, so loss = kl_coef * token-mean(kl).
    mask = torch.ones(1, 2)
    for est, per_token in (("k1", [0.5, -1.0]), ("k2", [0.125, 0.5]), ("k3", k3)):
        loss, metrics = policy_loss(logp, logp, torch.zeros(1), mask, ref_logprobs=ref,
                                    kl_coef=0.1, kl_estimator=est)
        assert loss.item() == pytest.approx(0.1 * sum(per_token) / 2)
        assert metrics["kl"] == pytest.approx(sum(per_token) / 2)
    _, metrics = policy_loss(logp, logp, torch.zeros(1), mask, ref_logprobs=ref)
    assert metrics["kl"] == pytest.approx(sum(k3) / 2) and metrics["loss"] == 0.0


def test_entropy_metric_and_argument_errors():
    logp = torch.zeros(2, 2)
    mask = torch.tensor([[1, 0], [1, 1]])
    entropy = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])  # NaN on a masked token
    _, metrics = policy_loss(logp, logp, torch.ones(2), mask, entropy=entropy)
    assert metrics["entropy"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logprobs"):
        policy_loss(logp, logp, torch.ones(2), mask, kl_coef=0.1)
    with pytest.raises(ValueError, match=r"advantages \(3,\)"):
        policy_loss(logp, logp, torch.ones(3), mask)
    with pytest.raises(ValueError, match="eps_low=1.5"):
        policy_loss(logp, logp, torch.ones(2), mask, eps_low=1.5)


# ---------- plain-loop reference ----------

def loop_policy_loss(logp, old, adv, mask, eps_low, eps_high, agg):
    b_size, t_size = len(logp), len(logp[0])
    per_seq, tokens = [], []
    for b in range(b_size):
        total, n = 0.0, 0
        for t in range(t_size):
            if not mask[b][t]:
                continue
            a = adv[b][t] if isinstance(adv[b], list) else adv[b]
            rho = math.exp(logp[b][t] - old[b][t])
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
            total += max(-a * rho, -a * clipped)
            n += 1
        per_seq.append(total)
        tokens.append(n)
    if agg == "token-mean":
        return sum(per_seq) / max(sum(tokens), 1)
    if agg == "seq-mean-token-mean":
        means = [s / n for s, n in zip(per_seq, tokens, strict=True) if n > 0]
        return sum(means) / len(means) if means else 0.0
    return sum(per_seq) / (b_size * t_size)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("token_adv", [False, True])
def test_vectorised_loss_matches_loop_reference(seed, agg, token_adv):
    g = torch.Generator().manual_seed(seed)
    b_size, t_size = (int(x) for x in torch.randint(1, 7, (2,), generator=g))
    old = -torch.rand(b_size, t_size, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(b_size, t_size, generator=g, dtype=torch.float64) * 0.4
    shape = (b_size, t_size) if token_adv else (b_size,)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(b_size, t_size, generator=g) < 0.7
    loss, _ = policy_loss(logp, old, adv, mask, agg=agg)
    want = loop_policy_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(),
                            0.2, 0.28, agg)
    assert loss.item() == pytest.approx(want, abs=1e-12)


# ---------- properties ----------

shapes = st.tuples(st.integers(1, 5), st.integers(1, 6))


def random_batch(seed: int, b_size: int, t_size: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b_size, t_size, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(b_size, generator=g, dtype=torch.float64)
    mask = torch.rand(b_size, t_size, generator=g) < 0.6
    return g, old, adv, mask


@settings(max_examples=50, deadline=None)
@given(shapes, st.integers(0, 10_000), st.sampled_from(AGG_MODES))
def test_gradient_at_rho_one_is_minus_advantage_over_normaliser(shape, seed, agg):
    b_size, t_size = shape
    _, old, adv, mask = random_batch(seed, b_size, t_size)
    logp = old.clone().requires_grad_(True)  # rho = 1 everywhere
    loss, _ = policy_loss(logp, old, adv, mask, agg=agg)
    loss.backward()
    m = mask.double()
    if agg == "token-mean":
        norm = m.sum().clamp(min=1).expand(b_size, t_size)
    elif agg == "seq-mean-token-mean":
        seqs = (m.sum(1) > 0).sum().clamp(min=1)
        norm = (seqs * m.sum(1).clamp(min=1))[:, None].expand(b_size, t_size)
    else:
        norm = torch.full((b_size, t_size), float(b_size * t_size), dtype=torch.float64)
    expected = -adv[:, None] * m / norm
    assert torch.allclose(logp.grad, expected, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(shapes, st.integers(0, 10_000), st.sampled_from(AGG_MODES),
       st.sampled_from(KL_ESTIMATORS))
def test_masked_tokens_change_nothing(shape, seed, agg, kl_estimator):
    b_size, t_size = shape
    g, old, adv, mask = random_batch(seed, b_size, t_size)
    logp = old + torch.randn(b_size, t_size, generator=g, dtype=torch.float64) * 0.5
    ref = old + torch.randn(b_size, t_size, generator=g, dtype=torch.float64) * 0.5
    adv_tok = adv[:, None].expand(b_size, t_size).clone()

    def run(lp, ol, rf, ad):
        lp = lp.clone().requires_grad_(True)
        loss, metrics = policy_loss(lp, ol, ad, mask, agg=agg, ref_logprobs=rf, kl_coef=0.05,
                                    kl_estimator=kl_estimator)
        loss.backward()
        return loss.detach(), lp.grad, metrics

    base = run(logp, old, ref, adv_tok)
    junk = torch.where(mask, 0.0, 1e4)  # huge (exp would overflow) or NaN on masked tokens
    nan = torch.where(mask, 0.0, float("nan"))
    other = run(logp + nan, old - junk, ref + nan, adv_tok + nan)
    assert torch.equal(base[0], run(logp + junk, old + nan, ref - junk, adv_tok)[0])
    assert torch.equal(base[0], other[0])
    assert torch.equal(base[1], other[1])
    assert (base[1][~mask] == 0).all()
    assert base[2] == other[2]


def test_entropy_bonus_is_subtracted_with_its_gradient():
    logp = torch.zeros(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    entropy = torch.tensor([[1.0, 3.0, 50.0]], requires_grad=True)
    loss, metrics = policy_loss(logp, logp, torch.zeros(1), mask, entropy=entropy,
                                entropy_coef=0.1)
    assert loss.item() == pytest.approx(-0.1 * 2.0) and metrics["entropy"] == 2.0
    loss.backward()
    assert entropy.grad[0].tolist() == pytest.approx([-0.05, -0.05, 0.0])
    with pytest.raises(ValueError, match="entropy_coef=0.1 needs entropy"):
        policy_loss(logp, logp, torch.zeros(1), mask, entropy_coef=0.1)
