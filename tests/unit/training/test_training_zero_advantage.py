"""A micro-batch whose advantages are all zero has an exactly zero policy gradient: it runs
its forward (pi_old, the metrics) but no backward, and the weights come out the same as with
the backward. Real tiny model, real steps (AdamW, so momentum and weight decay act on a
step whose gradient is zero)."""

from __future__ import annotations

import pytest
import torch
from training_testkit import sampled_samples

from mgrpo.engines.base import SamplingParams
from mgrpo.models import load_model
from mgrpo.training import update
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.update import UpdateSpec, policy_update


def _samples(tiny_dir, advantage):
    model, tok = load_model(tiny_dir)
    prompts = [[5 + i, 17, 33, 40 + 3 * i][: 2 + i % 3] for i in range(8)]
    return sampled_samples(model, tok, prompts, lambda i: SamplingParams(
        temperature=0.8, max_new_tokens=4 + i % 3, seed=i), advantage, 0.05)


def _train(tiny_dir, rounds, monkeypatch, skip: bool, **loss):
    if not skip:
        monkeypatch.setattr(update, "zero_advantage_skips", lambda cfg: False)
    backwards = []
    real_backward = torch.Tensor.backward
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: (
        backwards.append(1), real_backward(self, *a, **k))[1])
    model, tok = load_model(tiny_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.1)
    spec = UpdateSpec(ModelConfig(path=str(tiny_dir), micro_batch_size=2), LossConfig(**loss),
                      tok.pad_token_id, temperature=0.8)
    metrics = [policy_update(model, optimizer, samples, spec,
                             generator=torch.Generator().manual_seed(0)) for samples in rounds]
    monkeypatch.undo()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, len(backwards), metrics


@pytest.mark.parametrize("loss", [{}, {"rollout_is": "token"}])
def test_zero_advantage_micro_batches_skip_the_backward_with_the_same_weights(
        tiny_dir, monkeypatch, loss):
    mixed = _samples(tiny_dir, lambda i: 1.0 if i == 0 else -0.5 if i == 5 else 0.0)
    flat = _samples(tiny_dir, lambda i: 0.0)  # a round without any advantage
    rounds = [mixed, flat]
    skipped, n_skipped, m_skipped = _train(tiny_dir, rounds, monkeypatch, True, **loss)
    full, n_full, m_full = _train(tiny_dir, rounds, monkeypatch, False, **loss)
    assert n_full == 8  # 2 rounds x 4 micro-batches of 2
    assert n_skipped <= 2  # at most the micro-batches holding sample 0 or 5
    for name, weight in full.items():
        assert torch.equal(weight, skipped[name]), name
    for a, b in zip(m_skipped, m_full, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key


def test_a_kl_in_the_loss_keeps_the_backward(tiny_dir):
    assert update.zero_advantage_skips(LossConfig())
    assert not update.zero_advantage_skips(LossConfig(kl_coef=0.1))
    assert not update.zero_advantage_skips(LossConfig(entropy_coef=0.01))
