"""Policy-update metrics are true sums, means and maxima whatever the micro-batching, and
pi_old is recomputed in eval mode (no dropout noise in the ratio). Real tiny model."""

from __future__ import annotations

import pytest
import torch
from test_training_fused_old import _samples

from mgrpo.models import load_model
from mgrpo.models.lora import LoraSpec, apply_lora, trainable_parameters
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.update import UpdateSpec, policy_update


def _update(tiny_dir, samples, micro: int, mini_batches: int = 2, model=None):
    if model is None:
        model, _ = load_model(tiny_dir)
    optimizer = torch.optim.Adam(trainable_parameters(model), lr=3e-2)
    mcfg = ModelConfig(path=str(tiny_dir), mini_batches=mini_batches, micro_batch_size=micro)
    return policy_update(model, optimizer, samples,
                         UpdateSpec(mcfg, LossConfig(), pad_id=0, temperature=0.8),
                         generator=torch.Generator().manual_seed(0))


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


def test_micro_batch_metrics_stay_on_the_device(monkeypatch):
    """With ``tensor_metrics=True`` the loss's metrics and their totals are read back to the
    host only in ``result()``, once: a GPU's micro-batch loop never waits for a host read.
    The totals equal those of the float path exactly."""
    from mgrpo.algo import policy_loss
    from mgrpo.training.update_metrics import UpdateTotals

    gen = torch.Generator().manual_seed(3)
    parts = []
    for rows in (2, 3):
        logp = torch.randn(rows, 6, generator=gen) * 0.1 - 1.0
        old = logp + torch.randn(rows, 6, generator=gen) * 0.2
        mask = (torch.rand(rows, 6, generator=gen) > 0.3).float()
        ref = logp + 0.05
        parts.append((logp.requires_grad_(), old, torch.randn(rows, generator=gen), mask, ref))

    def totals(tensor_metrics: bool) -> UpdateTotals:
        out = UpdateTotals()
        for logp, old, adv, mask, ref in parts:
            _, metrics = policy_loss(logp, old, adv, mask, ref_logprobs=ref, kl_coef=0.1,
                                     entropy=-logp.detach(), tensor_metrics=tensor_metrics)
            share = mask.sum() / 20
            out.add_micro(metrics, share if tensor_metrics else float(share),
                          mask.sum() if tensor_metrics else float(mask.sum()))
        out.add_step(torch.tensor(1.5) if tensor_metrics else 1.5)
        return out

    expected = totals(False).result()
    reads = []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k:
                            reads.append(_n) or _o(self, *a, **k))
    on_device = totals(True)
    assert reads == []  # nothing read back while the micro-batches run
    got = on_device.result()
    assert reads == ["tolist"]  # one copy for all of them
    assert got == expected
    assert got["num_tokens"] == float(sum(p[3].sum() for p in parts))
