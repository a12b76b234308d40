from __future__ import annotations

import pytest
import torch

from mgrpo.engines.base import Engine, GenerationRequest, SamplingParams
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.models.logprobs import right_pad, token_logprobs

PROMPT_LENGTHS = [3, 11, 1, 7, 16, 5]


def _prompts(tok, lengths=PROMPT_LENGTHS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(30, len(tok), (n,), generator=gen).tolist() for n in lengths]


def _requests(prompts, **params):
    return [GenerationRequest(p, SamplingParams(seed=100 + i, **params))
            for i, p in enumerate(prompts)]


def _teacher_forced(model, pad_id, outs, temperature: float = 1.0):
    ids, mask = right_pad([o.prompt_ids + o.completion_ids for o in outs], pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, ids, mask, micro_batch_size=4, temperature=temperature)
    return [logp[i, len(o.prompt_ids):len(o.prompt_ids) + len(o.completion_ids)]
            for i, o in enumerate(outs)]


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_logprobs_equal_teacher_forced_pass_for_unequal_prompts(tiny, temperature):
    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False)
    assert isinstance(engine, Engine)
    outs = engine.generate(_requests(_prompts(tok), temperature=temperature, top_k=50,
                                     top_p=0.9, max_new_tokens=12))
    # logprobs of the distribution sampled from: logits / T (greedy rows: T = 1)
    ref_outs = _teacher_forced(model, tok.pad_token_id, outs, temperature or 1.0)
    for out, ref in zip(outs, ref_outs, strict=True):
        assert len(out.completion_ids) == 12 and out.finish_reason == "length"
        assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4), (out, ref)


def test_greedy_is_the_argmax_of_the_unpadded_model(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False)
    prompts = _prompts(tok)
    outs = engine.generate(_requests(prompts, temperature=0.0, max_new_tokens=6))
    for prompt, out in zip(prompts, outs, strict=True):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(6):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        assert out.completion_ids == seq[len(prompt):]


def test_seeded_requests_do_not_depend_on_batch_composition(tiny):
    model, tok = tiny
    requests = _requests(_prompts(tok), temperature=1.0, max_new_tokens=10)
    together = TorchEngine(model, tok, max_batch_size=64).generate(requests)
    alone = [TorchEngine(model, tok).generate([r])[0] for r in requests]
    split = TorchEngine(model, tok, max_batch_size=2).generate(requests[::-1])[::-1]
    for a, b, c in zip(together, alone, split, strict=True):
        assert a.completion_ids == b.completion_ids == c.completion_ids
    # different seeds give different samples (a random model is close to uniform)
    other = TorchEngine(model, tok).generate([GenerationRequest(
        requests[0].prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=10, seed=9))])
    assert other[0].completion_ids != together[0].completion_ids


def test_top_k_1_and_tiny_top_p_are_greedy(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False)
    prompts = _prompts(tok)
    greedy = engine.generate(_requests(prompts, temperature=0.0, max_new_tokens=8))
    top_k = engine.generate(_requests(prompts, temperature=1.5, top_k=1, max_new_tokens=8))
    top_p = engine.generate(_requests(prompts, temperature=1.5, top_p=1e-6, max_new_tokens=8))
    for g, k, p in zip(greedy, top_k, top_p, strict=True):
        assert g.completion_ids == k.completion_ids == p.completion_ids


def test_stop_token_ids_and_stop_strings_end_each_row_separately(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False)
    prompts = _prompts(tok)
    free = engine.generate(_requests(prompts, temperature=0.0, max_new_tokens=12))
    # stop each row at the token it produces 4th: generation must end exactly there
    requests = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=12,
                                                    stop_token_ids=[o.completion_ids[3]]))
                for p, o in zip(prompts, free, strict=True)]
    for out, ref in zip(engine.generate(requests), free, strict=True):
        first = ref.completion_ids.index(ref.completion_ids[3])
        assert out.completion_ids == ref.completion_ids[:first + 1]
        assert out.finish_reason == "stop"
    # a stop string: the decoded text of tokens 2..4 of the free run
    target = tok.decode(free[1].completion_ids[2:5], skip_special_tokens=False)
    out = engine.generate([GenerationRequest(prompts[1], SamplingParams(
        temperature=0.0, max_new_tokens=12, stop=[target]))])[0]
    assert out.finish_reason == "stop" and target in out.text
    assert len(out.completion_ids) <= 5
    assert target not in tok.decode(out.completion_ids[:-1], skip_special_tokens=False)


def test_eos_stops_by_default_and_zero_max_tokens_is_empty(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok)

    def favour_eos(module, inputs, logits):
        logits = logits.clone()
        logits[..., tok.eos_token_id] += 100.0  # makes <|end|> the argmax everywhere
        return logits

    model.lm_head.register_forward_hook(favour_eos)
    out = engine.generate(_requests(_prompts(tok, [4]), temperature=0.0, max_new_tokens=5))[0]
    assert out.completion_ids == [tok.eos_token_id] and out.finish_reason == "stop"
    empty = engine.generate(_requests(_prompts(tok, [4]), max_new_tokens=0))[0]
    assert empty.completion_ids == [] and empty.finish_reason == "length"
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([GenerationRequest([])])


def test_load_weights_from_state_dict_and_checkpoint(tiny, tmp_path):
    from mgrpo.models.checkpoint import save_checkpoint

    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False)
    requests = _requests(_prompts(tok), temperature=0.0, max_new_tokens=8)
    before = [o.completion_ids for o in engine.generate(requests)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}
        new_state["lm_head.weight"] = new_state["model.embed_tokens.weight"]
    engine.load_weights(new_state, version=3)
    assert engine.version == 3
    after = [o.completion_ids for o in engine.generate(requests)]
    assert after != before
    uri = save_checkpoint(model, str(tmp_path), "p", 3)
    engine.load_weights(state, version=4)
    assert [o.completion_ids for o in engine.generate(requests)] == before
    engine.load_weights(uri, version=5)
    assert engine.version == 5
    assert [o.completion_ids for o in engine.generate(requests)] == after


@pytest.mark.parametrize("sort_free", [True, False])
def test_sort_free_and_sorted_engines_report_the_teacher_forced_logprobs(tiny, sort_free):
    model, tok = tiny
    engine = TorchEngine(model, tok, stop_at_eos=False, sort_free=sort_free)
    outs = engine.generate(_requests(_prompts(tok), temperature=0.7, max_new_tokens=12))
    for out, ref in zip(outs, _teacher_forced(model, tok.pad_token_id, outs, 0.7),
                        strict=True):
        assert len(out.completion_ids) == 12
        assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4), (out, ref)
