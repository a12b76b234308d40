"""Policy-update metrics are true sums, means and maxima whatever the micro-batching, and
pi_old is recomputed in eval mode (no dropout noise in the ratio). Real tiny model."""

from __future__ import annotations

import pytest
import torch
from test_training_fused_old import _samples

from mgrpo.models import load_model
from mgrpo.models.lora import LoraSpec, apply_lora, trainable_parameters
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.update import policy_update


def _update(tiny_dir, samples, micro: int, mini_batches: int = 2, model=None):
    if model is None:
        model, _ = load_model(tiny_dir)
    optimizer = torch.optim.Adam(trainable_parameters(model), lr=3e-2)
    mcfg = ModelConfig(path=str(tiny_dir), mini_batches=mini_batches, micro_batch_size=micro)
    return policy_update(model, optimizer, samples, mcfg, LossConfig(), pad_id=0,
                         temperature=0.8, generator=torch.Generator().manual_seed(0))


def test_metrics_do_not_depend_on_the_micro_batch_size(tiny_dir):
    model, tok = load_model(tiny_dir)
    samples = _samples(model, tok)
    tokens = sum(sum(s.trajectory.response_mask) for s in samples)
    whole = _update(tiny_dir, samples, micro=8)
    for micro in (1, 2, 3):
        split = _update(tiny_dir, samples, micro=micro)
        assert split["num_tokens"] == tokens == whole["num_tokens"]  # a count, not a share
        for key in ("ratio_max", "ratio_mean", "adv_mean", "adv_std", "entropy", "approx_kl",
                    "clipfrac", "loss", "pg_loss"):
            assert split[key] == pytest.approx(whole[key], abs=2e-5), (micro, key)
    assert whole["ratio_max"] > 1.0  # the second mini-batch moved: a real maximum


def test_pi_old_is_computed_without_dropout(tiny_dir):
    """A LoRA model with dropout 0.5: sampled in eval mode, so pi_old (eval mode) equals the
    sampler's logprobs; a train-mode pi_old would carry dropout noise into the ratio."""
    torch.manual_seed(0)
    base, tok = load_model(tiny_dir)
    model = apply_lora(base, LoraSpec(r=4, alpha=8, dropout=0.5,
                                      target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a non-zero adapter, so its dropout changes the logits
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.eval()
    samples = _samples(model, tok)
    metrics = _update(tiny_dir, samples, micro=4, mini_batches=1, model=model)
    assert metrics["planner/rollout_logp_diff_max"] < 1e-4
