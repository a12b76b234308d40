"""Pure sampling helpers for the engines: filtering, per-row seeded draws, stop checks.

Seeding scheme: every request owns a ``torch.Generator`` seeded with its ``seed`` (or a seed
drawn from the global torch RNG when ``seed`` is None). A row's draws use only its own
generator, so a seeded request gives the same tokens whatever else is in the batch (up to
floating-point differences from padding, which can flip a draw that sits on a probability
boundary; on CPU float32 we have not seen one).

What it does NOT do: repetition penalties, beam search, logits processors beyond
temperature / top-k / top-p.
"""

from __future__ import annotations

import torch

from mgrpo.engines.base import SamplingParams


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator for one request; ``seed=None`` draws a seed from the global torch RNG.

    Greedy rows also consume one draw per step, so a request's stream never depends on
    its neighbours.
    """
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


class RowSampling:
    """The sampling constants of a batch's rows as tensors, built once per batch (not once
    per token) and cut down with the batch (:meth:`select`)."""

    def __init__(self, params: list[SamplingParams], vocab: int,
                 device: str | torch.device = "cpu", sort_free: bool = True):
        self.greedy = torch.tensor([p.temperature <= 0 for p in params], device=device)
        self.all_greedy = bool(self.greedy.all())
        # (B, 1): the row's temperature; 1 for greedy rows (their logprobs are untempered)
        self.temperature = torch.tensor([max(p.temperature, 1e-6) if p.temperature > 0 else 1.0
                                         for p in params], device=device)[:, None]
        self.sort_free = sort_free and all(not 0 < p.top_k < vocab and p.top_p >= 1
                                           for p in params)
        self.top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                                  device=device)
        self.top_p = torch.tensor([p.top_p for p in params], device=device)

    def select(self, index: torch.Tensor) -> None:
        self.greedy, self.temperature = self.greedy[index], self.temperature[index]
        self.top_k, self.top_p = self.top_k[index], self.top_p[index]
        self.all_greedy = bool(self.greedy.all())

    def draw(self, logits: torch.Tensor, uniform: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B,), logits / T (B, V)); ``uniform`` (B,) is one number in [0, 1) per row
        (None only when every row is greedy)."""
        scaled = logits.float() / self.temperature
        chosen = torch.argmax(logits, dim=-1)
        if self.all_greedy:
            return chosen, scaled
        vocab = logits.shape[-1]
        if self.sort_free:
            cdf = torch.softmax(scaled, dim=-1).cumsum(-1)
            # (1 - u) in (0, 1]: the target is > 0, so a zero-probability token is never chosen
            target = (1.0 - uniform)[:, None] * cdf[:, -1:]
            sampled = torch.searchsorted(cdf, target).clamp(max=vocab - 1).squeeze(-1)
            return torch.where(self.greedy, chosen, sampled), scaled
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        rank = torch.arange(vocab, device=logits.device)[None, :]
        mass_before = probs.cumsum(-1) - probs  # (B, V) mass of strictly more likely tokens
        keep = (rank < self.top_k[:, None]) & (mass_before < self.top_p[:, None])
        keep[:, 0] = True
        cdf = (probs * keep).cumsum(-1)  # (B, V)
        target = uniform[:, None] * cdf[:, -1:]
        index = torch.searchsorted(cdf, target).clamp(max=vocab - 1)  # (B, 1)
        sampled = order.gather(-1, index).squeeze(-1)
        return torch.where(self.greedy, chosen, sampled), scaled


def draw_uniforms(generators: list[torch.Generator], steps: list[int],
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """(B, max(steps)): row i's first ``steps[i]`` uniforms from its own generator, drawn at
    once (one call per row per batch instead of one per row per token); zeros after them.
    On CPU ``torch.rand(n, generator=g)`` gives the same numbers as n one-number draws
    (tests/unit/engines/test_engines_sampling.py checks it); on CUDA the stream differs but is
    still the request's own."""
    out = torch.zeros((len(generators), max(steps, default=0)), device=device)
    for i, (gen, n) in enumerate(zip(generators, steps, strict=True)):
        if n > 0:
            out[i, :n] = torch.rand(n, generator=gen, device=gen.device).to(device)
    return out


def sample_next(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator], sort_free: bool = True) -> torch.Tensor:
    """Choose the next token per row, vectorised over the batch. logits: (B, V) raw.

    Per row: temperature 0 = argmax. Otherwise ``softmax(logits / T)`` restricted to the top-k
    tokens (k = 0: all) and to the top-p nucleus (the smallest set of most likely tokens whose
    mass reaches top_p; the most likely token is always kept), then one draw by inverse CDF
    with a uniform number from the row's own generator. Returns (B,) long.

    ``sort_free`` (default): when no row filters (top_k off, top_p = 1) the CDF runs over the
    vocabulary in its own order: no (B, V) sort, which cost ~14% of a generation. Same
    distribution and the same one uniform per row per step, but a seed maps to a different
    token than with ``sort_free=False`` (the CDF's order differs).

    One call builds a :class:`RowSampling` and draws one uniform per row; the engine builds
    the first once per batch and draws all its uniforms up front (:func:`draw_uniforms`).
    """
    rows = RowSampling(params, logits.shape[-1], logits.device, sort_free)
    if rows.all_greedy:
        return rows.draw(logits, None)[0]
    # one uniform per row from the row's own generator: its stream ignores other rows
    uniform = torch.stack([torch.rand((), generator=g, device=g.device)
                           for g in generators]).to(logits.device)
    return rows.draw(logits, uniform)[0]


def stop_window(stops: list[str]) -> int:
    """Tokens to decode to see any stop string: a byte-level token holds >= 1 byte, so a stop
    string of n bytes spans at most n tokens, plus one that may straddle its start."""
    return max((len(s.encode()) for s in stops), default=0) + 1


def hits_stop_string(tail_text: str, stops: list[str]) -> bool:
    """True when the decoded tail of a completion contains a stop string."""
    return any(s and s in tail_text for s in stops)
