"""StaticDecoder (TorchEngine's fast path) against transformers' own forward pass."""

from __future__ import annotations

import pytest
import torch

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.decoders import DynamicDecoder, StaticDecoder, make_decoder, unsupported_reason
from mgrpo.engines.torch_engine import TorchEngine

LOGIT_ATOL = 1e-4  # float32; measured differences are ~1e-6 (reduction order only)
LENGTHS = [3, 11, 1, 7, 16, 5]


def _batch(tok, lengths=LENGTHS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), tok.pad_token_id)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(30, len(tok), (n,), generator=gen)
        mask[i, width - n:] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("fuse", [True, False])
@torch.inference_mode()
def test_static_logits_match_the_transformers_forward_pass_step_by_step(tiny, fuse):
    model, tok = tiny
    assert unsupported_reason(model) is None
    ids, mask, positions = _batch(tok)
    static = StaticDecoder(model, len(LENGTHS), ids.shape[1], 20, fuse=fuse)
    dynamic = DynamicDecoder(model)
    a, b = static.prefill(ids, mask, positions), dynamic.prefill(ids, mask, positions)
    assert torch.allclose(a, b, atol=LOGIT_ATOL)
    gen = torch.Generator().manual_seed(1)
    for step in range(20):
        if step == 7:  # rows 1 and 4 finish: both decoders drop them
            keep = torch.tensor([0, 2, 3, 5])
            static.select(keep)
            dynamic.select(keep)
            a, b = a[keep], b[keep]
        tokens = torch.randint(30, len(tok), (a.shape[0],), generator=gen)
        a, b = static.step(tokens), dynamic.step(tokens)
        assert a.shape == b.shape
        assert (a - b).abs().max() < LOGIT_ATOL, step
    with pytest.raises(ValueError, match="static cache full"):
        static.step(tokens)


def test_engine_outputs_equal_with_and_without_the_static_cache(tiny):
    model, tok = tiny
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(30, len(tok), (n,), generator=gen).tolist() for n in LENGTHS]
    for params in (dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7),
                   dict(temperature=1.0, top_k=20, top_p=0.9)):
        # unequal max_new_tokens: rows leave the batch at different steps
        requests = [GenerationRequest(p, SamplingParams(seed=50 + i, max_new_tokens=4 + 3 * i,
                                                        **params))
                    for i, p in enumerate(prompts)]
        fast = TorchEngine(model, tok, stop_at_eos=False).generate(requests)
        slow = TorchEngine(model, tok, stop_at_eos=False, static_cache=False).generate(requests)
        for f, s in zip(fast, slow, strict=True):
            assert f.completion_ids == s.completion_ids, params
            assert len(f.completion_ids) == len(f.logprobs)
            assert torch.allclose(torch.tensor(f.logprobs), torch.tensor(s.logprobs),
                                  atol=1e-5), params


def test_lora_models_fall_back_to_the_transformers_forward_pass(tiny):
    from mgrpo.models.lora import apply_lora

    model, tok = tiny
    lora = apply_lora(model)
    assert unsupported_reason(lora) == "a peft (LoRA) model"
    assert isinstance(make_decoder(lora, 2, 4, 4), DynamicDecoder)
    assert isinstance(make_decoder(model, 2, 4, 4, static=False), DynamicDecoder)
    out = TorchEngine(lora, tok, stop_at_eos=False).generate(
        [GenerationRequest([40, 41, 42], SamplingParams(temperature=0.0, max_new_tokens=3))])
    assert len(out[0].completion_ids) == 3


def test_weights_changed_in_place_are_seen_by_the_next_call(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False)
    request = [GenerationRequest([40, 41, 42, 43], SamplingParams(temperature=0.0,
                                                                   max_new_tokens=6))]
    before = engine.generate(request)[0]
    with torch.no_grad():  # what an optimizer step does to a shared model
        for p in model.model.layers[0].parameters():
            p.add_(0.5 * torch.randn_like(p))
    after = engine.generate(request)[0]
    reference = TorchEngine(model, tok, stop_at_eos=False, static_cache=False).generate(
        request)[0]
    assert after.logprobs != before.logprobs
    assert after.completion_ids == reference.completion_ids
    assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(reference.logprobs),
                          atol=1e-5)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, LOGIT_ATOL),
                                         # bf16 rounds at a few places in another order:
                                         # measured 0.0039 (one bf16 step at |logit| ~0.5)
                                         (torch.bfloat16, 2e-2)])
@torch.inference_mode()
def test_a_llama_model_without_biases_matches_too(dtype, atol):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    model = model.to(dtype).eval()
    assert unsupported_reason(model) is None
    ids = torch.randint(5, 300, (3, 6))
    mask = torch.ones_like(ids)
    mask[0, :3] = mask[2, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    static, dynamic = StaticDecoder(model, 3, 6, 8), DynamicDecoder(model)
    a, b = static.prefill(ids, mask, positions), dynamic.prefill(ids, mask, positions)
    assert a.dtype == b.dtype == dtype
    assert (a.float() - b.float()).abs().max() < atol
    for _ in range(8):
        tokens = torch.randint(5, 300, (3,))
        a, b = static.step(tokens), dynamic.step(tokens)
        assert (a.float() - b.float()).abs().max() < atol


def test_a_compiled_decode_step_gives_the_eager_outputs(tiny):
    """``compile_options`` put the fixed-shape step through torch.compile (here its ``eager``
    backend: Dynamo's trace without code generation); a row leaves the batch after its first
    step (new cache tensors, a new trace)."""
    model, tok = tiny
    requests = [GenerationRequest([31, 40, 52], SamplingParams(seed=7, max_new_tokens=2)),
                GenerationRequest([33, 61], SamplingParams(seed=8, max_new_tokens=3))]
    eager = TorchEngine(model, tok, stop_at_eos=False).generate(requests)
    compiled = TorchEngine(model, tok, stop_at_eos=False,
                           compile_options={"backend": "eager"}).generate(requests)
    for c, e in zip(compiled, eager, strict=True):  # all L columns summed, masked: rounding
        assert c.completion_ids == e.completion_ids
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(e.logprobs),
                                   atol=1e-5, rtol=0)
