"""The chunked vocabulary log-softmax against the plain autograd reference: values, entropy
and gradients (float32 and bf16 logits, temperatures, chunk sizes that do and do not divide
the rows), and hand-computed small cases."""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo.algo.vocab_logprobs import (
    chunk_rows_for,
    chunked_logprobs_from_logits,
    logprobs_from_logits,
)


def _inputs(shape=(3, 7), vocab=50, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(*shape, vocab, generator=gen)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, shape, generator=gen)
    return logits, labels


def test_hand_computed_two_token_vocabulary():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = (1/4, 3/4)
    logp, ent = chunked_logprobs_from_logits(logits, torch.tensor([1]), with_entropy=True)
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-7)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)),
                                       abs=1e-7)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("rows", [1, 4, 21, 64])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_values_and_gradients_match_the_reference(temperature, rows, entropy_grad):
    logits, labels = _inputs()
    weights = torch.randn(3, 7, generator=torch.Generator().manual_seed(5))
    results = []
    for fn, kwargs in ((logprobs_from_logits, {}),
                       (chunked_logprobs_from_logits, {"chunk_rows": rows})):
        logits.grad = None
        logp, ent = fn(logits, labels, temperature, with_entropy=True,
                       entropy_grad=entropy_grad, **kwargs)
        loss = (logp * weights).sum() + (0.3 * (ent * weights).sum() if entropy_grad else 0)
        loss.backward()
        results.append((logp.detach(), ent.detach(), logits.grad.clone()))
    (ref_lp, ref_h, ref_g), (lp, h, g) = results
    assert lp.dtype == h.dtype == torch.float32 and lp.shape == (3, 7)
    torch.testing.assert_close(lp, ref_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(h, ref_h, atol=1e-5, rtol=0)  # the reference's cancellation
    log_p = torch.log_softmax(logits.detach().double() / temperature, -1)  # float64 truth
    torch.testing.assert_close(h.double(), -(log_p.exp() * log_p).sum(-1), atol=2e-6, rtol=0)
    torch.testing.assert_close(lp.double(), log_p.gather(-1, labels[..., None])[..., 0],
                               atol=2e-6, rtol=0)
    torch.testing.assert_close(g, ref_g, atol=1e-6, rtol=1e-5)


def test_bf16_logits_give_a_bf16_gradient_equal_to_the_reference():
    logits, labels = _inputs(dtype=torch.bfloat16)
    grads = []
    for fn in (logprobs_from_logits, chunked_logprobs_from_logits):
        logits.grad = None
        logp, _ = fn(logits, labels, with_entropy=False)
        logp.sum().backward()
        grads.append(logits.grad.float())
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(grads[1], grads[0], atol=1e-2, rtol=1e-2)  # bf16 rounding


def test_entropy_has_no_gradient_unless_asked():
    logits, labels = _inputs()
    _, ent = chunked_logprobs_from_logits(logits, labels, with_entropy=True)
    assert not ent.requires_grad
    _, ent = chunked_logprobs_from_logits(logits, labels, with_entropy=True, entropy_grad=True)
    assert ent.requires_grad


def test_chunk_rows_bound_the_temporaries():
    assert chunk_rows_for(49152) == 85 and chunk_rows_for(10**9) == 1
