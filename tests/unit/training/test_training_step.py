"""The public single-agent GRPO step (issue 15 item 3): real tiny model, real update."""

from __future__ import annotations

import pytest
import torch

from mgrpo.models import load_model
from mgrpo.training.config import ModelConfig
from mgrpo.training.step import grpo_step


def _even_share(prompt_ids, completion) -> float:
    return sum(t % 2 == 0 for t in completion.completion_ids) / len(completion.completion_ids)


def _step(tiny_dir, **kw):
    model, tok = load_model(tiny_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    prompts = [[5 + i, 17, 33][: 1 + i % 3] for i in range(3)]
    result = grpo_step(model, tok, optimizer, prompts, _even_share, group_size=4,
                       max_new_tokens=7, temperature=0.9, seed=11, stop_at_eos=False,
                       model_cfg=ModelConfig(path=str(tiny_dir), micro_batch_size=5), **kw)
    return result, model


def test_grpo_step_samples_groups_scores_and_updates(tiny_dir):
    result, model = _step(tiny_dir)
    before, _ = load_model(tiny_dir)
    assert len(result.completions) == 12  # 3 prompts x 4
    assert all(len(c.completion_ids) == 7 for c in result.completions)  # fixed length
    adv = torch.tensor(result.advantages).view(3, 4)
    rewards = torch.tensor(result.rewards).view(3, 4)
    torch.testing.assert_close(adv.sum(1), torch.zeros(3), atol=1e-5, rtol=0)  # per group
    expected = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, unbiased=False,
                                                                        keepdim=True) + 1e-6)
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=1e-4)
    m = result.metrics
    assert m["reward_mean"] == pytest.approx(float(rewards.mean()))
    assert m["grad_norm"] > 0 and m["num_tokens"] > 0 and m["gen_s"] > 0 and m["update_s"] > 0
    assert m["policy/rollout_logp_diff_max"] < 1e-4  # sampled and trained at T = 0.9
    moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), before.parameters(),
                                                   strict=True)]
    assert any(moved)


def test_grpo_step_is_seeded_and_the_fused_pi_old_changes_nothing(tiny_dir):
    a, model_a = _step(tiny_dir)
    b, model_b = _step(tiny_dir, reuse_first_pass=False)
    assert [c.completion_ids for c in a.completions] == [c.completion_ids for c in b.completions]
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_grpo_step_refuses_bad_arguments(tiny_dir):
    model, tok = load_model(tiny_dir)
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="group_size=1"):
        grpo_step(model, tok, opt, [[5]], _even_share, group_size=1)
    with pytest.raises(ValueError, match="non-empty"):
        grpo_step(model, tok, opt, [[]], _even_share)
    with pytest.raises(ValueError, match="temperature=0"):
        grpo_step(model, tok, opt, [[5]], _even_share, temperature=0)
