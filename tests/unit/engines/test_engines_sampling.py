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


# a small vocabulary whose own order is NOT the order of probability (the sort-free CDF
# runs in vocabulary order; the sorted one in probability order)
SHUFFLED = torch.log(torch.tensor([0.05, 0.3, 0.0001, 0.15, 0.2, 0.2999]))


def test_sort_free_draws_follow_the_same_softmax_as_the_sorted_path():
    n = 6000
    for temperature in (1.0, 0.6):
        probs = torch.softmax(SHUFFLED / temperature, -1)
        for sort_free in (True, False):
            gen = make_generator(3)
            params = [SamplingParams(temperature=temperature)]
            draws = torch.tensor([int(sample_next(SHUFFLED[None], params, [gen],
                                                  sort_free=sort_free)[0]) for _ in range(n)])
            freq = torch.bincount(draws, minlength=6).double()
            expected = probs.double() * n
            chi2 = float(((freq - expected) ** 2 / expected).sum())
            assert chi2 < 20.5, (temperature, sort_free, freq)  # p = 0.001 at 5 dof


def test_sort_free_is_taken_only_without_top_k_or_top_p():
    # same seed: the sort-free stream differs from the sorted one on a shuffled vocabulary ...
    def stream(params, sort_free):
        gen = make_generator(5)
        return [int(sample_next(SHUFFLED[None], [params], [gen], sort_free=sort_free)[0])
                for _ in range(40)]

    plain = SamplingParams(temperature=1.0)
    assert stream(plain, True) != stream(plain, False)
    # ... but a filtering row always uses the sorted path, whatever the flag
    for filtered in (SamplingParams(temperature=1.0, top_k=3),
                     SamplingParams(temperature=1.0, top_p=0.7)):
        assert stream(filtered, True) == stream(filtered, False)
    # a (1 - u) target never lands on a zero-probability token
    zero = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]])
    gen = make_generator(0)
    assert {int(sample_next(zero, [plain], [gen])[0]) for _ in range(300)} == {0, 2}


def test_uniforms_drawn_at_once_equal_one_draw_per_step_on_cpu():
    from mgrpo.engines.sampling import draw_uniforms

    gens = [make_generator(s) for s in (1, 2, 3)]
    table = draw_uniforms(gens, [5, 0, 40])
    assert table.shape == (3, 40)
    for seed, n, row in zip((1, 2, 3), [5, 0, 40], table, strict=True):
        gen = make_generator(seed)
        one_by_one = [torch.rand((), generator=gen) for _ in range(n)]
        assert row[:n].tolist() == [float(u) for u in one_by_one]
        assert not row[n:].any()
