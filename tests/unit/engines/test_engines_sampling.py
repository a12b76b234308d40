from __future__ import annotations

import torch

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.sampling import hits_stop_string, make_generator, sample_next, stop_window

LOGITS = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))


def _draw(params: SamplingParams, n=4000, seed=0) -> torch.Tensor:
    gen = make_generator(seed)
    logits = LOGITS[None, :]
    draws = [int(sample_next(logits, [params], [gen])[0]) for _ in range(n)]
    return torch.bincount(torch.tensor(draws), minlength=5).float() / n


def test_temperature_one_follows_the_softmax():
    freq = _draw(SamplingParams(temperature=1.0))
    assert torch.allclose(freq, LOGITS.exp(), atol=0.03), freq


def test_top_k_and_top_p_renormalise_over_the_kept_tokens():
    freq_k = _draw(SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(freq_k, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]), atol=0.03), freq_k
    # mass before token 2 is 0.7 < 0.8 -> kept; before token 3 it is 0.85 -> dropped
    freq_p = _draw(SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(freq_p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=0.03)


def test_temperature_sharpens_and_zero_is_argmax():
    cold = _draw(SamplingParams(temperature=0.25), n=1000)
    probs = torch.softmax(LOGITS / 0.25, -1)
    assert torch.allclose(cold, probs, atol=0.04)
    assert _draw(SamplingParams(temperature=0.0), n=20)[0] == 1.0


def test_a_rows_draws_use_only_its_own_generator():
    logits = LOGITS.repeat(3, 1)
    params = [SamplingParams(temperature=1.0)] * 3
    solo_gen = make_generator(7)
    alone = [int(sample_next(logits[:1], params[:1], [solo_gen])[0]) for _ in range(20)]
    gens = [make_generator(1), make_generator(7), make_generator(2)]
    batched = [int(sample_next(logits, params, gens)[1]) for _ in range(20)]
    assert batched == alone


def test_stop_window_covers_the_longest_stop_string():
    assert stop_window([]) == 1
    assert stop_window(["</call>", "ab"]) == len("</call>") + 1
    assert hits_stop_string("xx</call>", ["</call>"]) and not hits_stop_string("x", [""])
