"""The update's response-only logits and chunked vocabulary log-softmax
(:class:`mgrpo.training.update.LogitsPlan`) against the plain path: the same metrics and the
same updated weights after a real step of the tiny model (uneven prompts, two mini-batches,
entropy in the loss)."""

from __future__ import annotations

import pytest
import torch
from training_testkit import sampled_samples

from mgrpo.engines.base import SamplingParams
from mgrpo.models import load_model
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.update import LogitsPlan, UpdateSpec, policy_update


def _run(tiny_dir, samples, plan: LogitsPlan):
    model, tok = load_model(tiny_dir)
    # SGD: the weights move by the gradient itself (Adam's m / sqrt(v) would magnify float
    # rounding in near-zero gradients), so equal weights after the steps = equal gradients
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    mcfg = ModelConfig(path=str(tiny_dir), mini_batches=2, micro_batch_size=3)
    spec = UpdateSpec(mcfg, LossConfig(entropy_coef=0.01, rollout_is="none"), tok.pad_token_id,
                      temperature=0.8, logits=plan)
    metrics = policy_update(model, optimizer, samples, spec,
                            generator=torch.Generator().manual_seed(0))
    return metrics, dict(model.named_parameters())


@pytest.mark.parametrize("plan", [LogitsPlan(), LogitsPlan(response_only=False),
                                  LogitsPlan(chunked=False)])
def test_logits_plan_gives_the_plain_update(tiny_dir, plan):
    model, tok = load_model(tiny_dir)
    prompts = [[5 + i, 17, 33, 40 + 3 * i, 9, 12][: 2 + i % 5] for i in range(8)]
    samples = sampled_samples(model, tok, prompts, lambda i: SamplingParams(
        temperature=0.8, max_new_tokens=4 + i % 3, seed=i), lambda i: (1.0, -0.5, 2.0)[i % 3])
    plain, w_plain = _run(tiny_dir, samples, LogitsPlan(response_only=False, chunked=False))
    fast, w_fast = _run(tiny_dir, samples, plan)
    assert fast.keys() == plain.keys()
    for key in plain:
        assert fast[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5), key
    moved = 0.0
    for name, value in w_plain.items():
        torch.testing.assert_close(w_fast[name], value, rtol=1e-4, atol=1e-6)
        moved = max(moved, float((value - dict(model.named_parameters())[name]).abs().max()))
    assert moved > 1e-3  # the steps changed the weights
