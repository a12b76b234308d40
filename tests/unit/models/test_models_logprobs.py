from __future__ import annotations

import pytest
import torch

from mgrpo.models.logprobs import right_pad, token_logprobs
from mgrpo.models.sft import masked_nll


def _loop_reference(model, seq: list[int]) -> list[float]:
    """Slow reference: one unpadded forward per sequence, log_softmax, pick each next token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [0.0] + [logp[t - 1, seq[t]].item() for t in range(1, len(seq))]


def _batch(lengths, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(20, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_matches_unpadded_loop_on_a_right_padded_batch(tiny):
    model, tok = tiny
    seqs = _batch([7, 3, 12, 1, 9], len(tok))
    ids, mask = right_pad(seqs, tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, ids, mask, micro_batch_size=2)
    assert logp.shape == ids.shape
    assert torch.all(logp[:, 0] == 0)
    for row, seq in enumerate(seqs):
        ref = torch.tensor(_loop_reference(model, seq))
        assert torch.allclose(logp[row, :len(seq)], ref, atol=1e-5)


def test_entropy_matches_definition(tiny):
    model, tok = tiny
    ids, mask = right_pad(_batch([6, 4], len(tok)), tok.pad_token_id)
    with torch.no_grad():
        logp, ent = token_logprobs(model, ids, mask, with_entropy=True)
        probs = torch.softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    manual = -(probs * probs.clamp_min(1e-30).log()).sum(-1)  # (B, T): H of p(. | x_<=t)
    assert torch.allclose(ent[:, 1:], manual[:, :-1], atol=1e-4)
    assert torch.all(ent[:, 0] == 0) and torch.all(ent[:, 1:] > 0)


def test_micro_batches_1x8_and_8x1_give_same_loss_and_gradients(tiny):
    model, tok = tiny
    model.train()
    seqs = _batch([5, 9, 3, 12, 7, 2, 10, 6], len(tok), seed=1)
    ids, attention = right_pad(seqs, tok.pad_token_id)
    gen = torch.Generator().manual_seed(2)
    loss_mask = (torch.rand(ids.shape, generator=gen) < 0.6).long() * attention

    results = []
    for micro in (8, 1):
        model.zero_grad(set_to_none=True)
        loss = masked_nll(model, ids, attention, loss_mask, micro_batch_size=micro,
                          backward=True)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((loss, grads))
    (loss8, grads8), (loss1, grads1) = results
    assert abs(loss8 - loss1) < 1e-5
    assert loss8 > 0
    for name in grads8:
        assert torch.allclose(grads8[name], grads1[name], atol=1e-6, rtol=1e-4), name
    assert any(g.abs().sum() > 0 for g in grads8.values())


def test_temperature_divides_the_logits(tiny):
    model, tok = tiny
    ids, mask = right_pad(_batch([6, 4], len(tok)), tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, ids, mask, temperature=0.5)
        logits = model(input_ids=ids, attention_mask=mask).logits.float() / 0.5
    manual = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(logp[:, 1:], manual, atol=1e-5)
    assert not torch.allclose(logp, token_logprobs(model, ids, mask).detach(), atol=1e-3)
    with pytest.raises(ValueError, match="temperature=0 must be > 0"):
        token_logprobs(model, ids, mask, temperature=0)


@pytest.mark.parametrize("first", [1, 3, 6])
def test_response_only_chunked_logprobs_equal_the_plain_path_with_gradients(tiny, first):
    model, tok = tiny
    ids, mask = right_pad(_batch([9, 6, 11], len(tok), seed=3), tok.pad_token_id)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(4))
    results = []
    for kwargs in ({"chunked": False}, {"first_position": first}):
        model.zero_grad(set_to_none=True)
        logp, ent = token_logprobs(model, ids, mask, with_entropy=True, temperature=0.8,
                                   entropy_grad=True, **kwargs)
        ((logp + 0.1 * ent)[:, first:] * weights[:, first:]).sum().backward()
        results.append((logp.detach(), ent.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_ref, ent_ref, grads_ref), (lp, ent, grads) = results
    assert torch.all(lp[:, :first] == 0) and torch.all(ent[:, :first] == 0)
    torch.testing.assert_close(lp[:, first:], lp_ref[:, first:], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[:, first:], ent_ref[:, first:], atol=1e-5, rtol=0)
    for name, grad in grads_ref.items():
        torch.testing.assert_close(grads[name], grad, atol=5e-6, rtol=1e-4)  # summation order


def test_response_only_logits_are_the_only_ones_computed(tiny):
    model, tok = tiny
    ids, mask = right_pad(_batch([10, 8], len(tok)), tok.pad_token_id)
    shapes = []
    model.lm_head.register_forward_hook(lambda mod, args, out: shapes.append(out.shape[1]))
    with torch.no_grad():
        token_logprobs(model, ids, mask, first_position=7)
    assert shapes == [10 - 7 + 1]  # positions 6..9: 6..8 predict tokens 7..9, 9 is dropped
    with pytest.raises(ValueError, match="first_position=0"):
        token_logprobs(model, ids, mask, first_position=0)
