"""pi_old without a separate forward pass (issue 15 item 3): the first mini-batch's own
forward, detached, is pi_old; the numbers equal the recompute path's; later mini-batches
still use the pi_old stored before the first optimizer step. Real tiny model, real steps."""

from __future__ import annotations

import pytest
import torch
from training_testkit import sampled_samples

from mgrpo.engines.base import SamplingParams
from mgrpo.models import load_model
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.scoring import Sample
from mgrpo.training.update import UpdateSpec, policy_update


def _samples(model, tok, shift: float = 0.0) -> list[Sample]:
    """Eight rollouts of uneven length (padding matters), advantages of both signs."""
    prompts = [[5 + i, 17, 33, 40 + 3 * i][: 2 + i % 3] for i in range(8)]
    return sampled_samples(model, tok, prompts, lambda i: SamplingParams(
        temperature=0.8, max_new_tokens=5 + i % 3, seed=i), lambda i: (1.0, -0.5, 2.0)[i % 3],
        shift)


def _run(tiny_dir, samples, reuse: bool, mini_batches: int, **loss):
    model, tok = load_model(tiny_dir)
    calls = []
    model.register_forward_hook(lambda mod, args, kwargs, out: calls.append(
        kwargs["input_ids"].shape[0]), with_kwargs=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    mcfg = ModelConfig(path=str(tiny_dir), mini_batches=mini_batches, micro_batch_size=2)
    spec = UpdateSpec(mcfg, LossConfig(**loss), tok.pad_token_id, temperature=0.8,
                      reuse_first_pass=reuse)
    metrics = policy_update(model, optimizer, samples, spec,
                            generator=torch.Generator().manual_seed(0))
    return metrics, dict(model.named_parameters()), calls


@pytest.fixture(scope="module")
def samples(tiny_dir):
    model, tok = load_model(tiny_dir)
    return _samples(model, tok, shift=0.05)


@pytest.mark.parametrize("loss", [{}, {"rollout_is": "token"},
                                  {"rollout_is": "sequence", "agg": "seq-mean-token-mean"}])
def test_one_mini_batch_skips_the_old_logprob_pass_with_the_same_update(tiny_dir, samples,
                                                                        loss):
    fused, w_fused, calls_fused = _run(tiny_dir, samples, True, 1, **loss)
    plain, w_plain, calls_plain = _run(tiny_dir, samples, False, 1, **loss)
    # 8 rows, micro-batches of 2: 4 forwards instead of 4 + 4 (the no-grad pi_old pass)
    assert calls_fused == [2, 2, 2, 2] and sum(calls_plain) == 16
    assert fused.keys() == plain.keys()
    for key in plain:
        assert fused[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5), key
    assert fused["ratio_mean"] == 1.0 and fused["clipfrac"] == 0.0  # rho = 1 exactly
    for name, value in w_plain.items():  # the same step: equal updated weights
        torch.testing.assert_close(w_fused[name], value, rtol=1e-4, atol=1e-5)
    # the rollout-correction metrics still read the sampler against the trainer
    assert fused["planner/rollout_logp_diff_mean"] == pytest.approx(0.05, abs=1e-4)


def test_later_mini_batches_use_the_pi_old_stored_before_the_first_step(tiny_dir, samples):
    fused, w_fused, calls = _run(tiny_dir, samples, True, 3, rollout_is="token")
    plain, w_plain, _ = _run(tiny_dir, samples, False, 3, rollout_is="token")
    # mini-batches of 3, 3, 2: pi_old pass over the 5 later rows only, then 3 + 3 + 2 rows
    assert sum(calls) == 5 + 8
    # steps 2 and 3 see moved weights: rho != 1 there, as on the recompute path
    assert fused["approx_kl"] > 1e-6 and fused["ratio_max"] > 1.0
    for key in ("approx_kl", "ratio_mean", "ratio_max", "loss", "pg_loss", "grad_norm",
                "rollout_is_mean", "searcher/rollout_logp_diff_max"):
        assert fused[key] == pytest.approx(plain[key], rel=1e-3, abs=1e-6), key
    for name, value in w_plain.items():
        torch.testing.assert_close(w_fused[name], value, rtol=1e-3, atol=1e-5)
