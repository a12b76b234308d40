"""Log-probability of each label (and the entropy) from logits, over a large vocabulary.

For logits ``z`` (N, V), labels ``y`` (N,) and temperature ``T``, with ``s = z / T``::

    logp_i = s_i[y_i] - logsumexp(s_i)                       # log softmax(s_i)[y_i]
    H_i    = logsumexp(s_i) - sum_v softmax(s_i)_v * s_i,v    # entropy of softmax(s_i)

Two implementations of the same numbers:

- :func:`logprobs_from_logits`: the plain reference, torch autograd on the whole (N, V)
  block. Its forward and backward each hold several (N, V) float32 temporaries (the
  float32 copy of bf16 logits, ``exp`` inside logsumexp, the softmax of its backward, the
  gather's scattered gradient and their sum).
- :func:`chunked_logprobs_from_logits`: the same forward and backward by hand, ``chunk_rows``
  positions at a time (verl's ``logprobs_from_logits_v2`` and torchtune's chunked
  cross-entropy do the forward part the same way). Nothing of size (N, V) is created but the
  gradient of the logits itself; it saves only the logits (no copy), ``logsumexp`` and the
  entropy for its backward. Gradient (``g`` the incoming gradient of logp, ``h`` of H,
  ``p = softmax(s)``)::

      dL/dz = (g * (onehot(y) - p) - h * p * (s - E_p[s])) / T,   E_p[s] = logsumexp(s) - H

  Same values as the reference up to float rounding (per position the same reductions).
  The entropy is summed as ``-sum p log p``, closer to the float64 value than the
  reference's ``log Z - E_p[s]`` (two large terms cancel). Bounds asserted in float32 by
  ``tests/unit/algo/test_algo_vocab_logprobs.py``: logp 1e-6 and the gradient 1e-6 + 1e-5
  relative of the reference, the entropy 1e-5 of the reference and 2e-6 of float64.

What it does NOT do: compute the logits (no fused linear layer: the caller's lm_head does
that, so a sharded or wrapped model's forward stays its own), masks or reductions.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_ELEMENTS = 2**22  # float32 elements per chunk: 16 MiB of temporaries


def chunk_rows_for(vocab: int, elements: int = DEFAULT_CHUNK_ELEMENTS) -> int:
    """Rows per chunk so one chunk's float32 temporaries hold about ``elements`` values."""
    return max(1, elements // max(vocab, 1))


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False, entropy_grad: bool = False,
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain reference. ``logits`` (..., V) any float dtype, ``labels`` (...) int ->
    logp (...) float32, and with ``with_entropy`` the entropy (...) float32 (no gradient
    unless ``entropy_grad``), else None."""
    s = logits.float()
    if temperature != 1.0:
        s = s / temperature
    log_z = torch.logsumexp(s, dim=-1)
    logp = s.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        with torch.enable_grad() if entropy_grad else torch.no_grad():
            probs = torch.softmax(s, dim=-1)
            entropy = log_z - (probs * s).sum(-1)
    return logp, entropy


def chunked_logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                                 temperature: float = 1.0, with_entropy: bool = False,
                                 entropy_grad: bool = False, chunk_rows: int | None = None,
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`logprobs_from_logits`, ``chunk_rows`` positions at a time (default
    :func:`chunk_rows_for` the vocabulary). ``logits`` (..., V), ``labels`` (...) ->
    logp (...) float32 [, entropy (...) float32]. Differentiable in ``logits`` (the
    entropy only with ``entropy_grad``)."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    rows = chunk_rows or chunk_rows_for(vocab)
    logp, entropy = _ChunkedLogprobs.apply(logits.reshape(-1, vocab), labels.reshape(-1),
                                           float(temperature), rows, with_entropy,
                                           entropy_grad)
    if not with_entropy:
        return logp.view(lead), None
    if not entropy_grad:
        entropy = entropy.detach()
    return logp.view(lead), entropy.view(lead)


def _scaled(block: torch.Tensor, temperature: float) -> torch.Tensor:
    s = block.float()
    return s / temperature if temperature != 1.0 else s


class _ChunkedLogprobs(torch.autograd.Function):
    """(N, V) logits, (N,) labels -> logp (N,), entropy (N,) (zeros when not asked)."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, rows, with_entropy, entropy_grad):
        n = logits.shape[0]
        logp = logits.new_empty(n, dtype=torch.float32)
        log_z = torch.empty_like(logp)
        entropy = torch.zeros_like(logp)
        for start in range(0, n, rows):
            part = slice(start, min(start + rows, n))
            s = _scaled(logits[part], temperature)  # (r, V)
            log_z[part] = torch.logsumexp(s, dim=-1)
            logp[part] = s.gather(-1, labels[part, None]).squeeze(-1) - log_z[part]
            if with_entropy:  # H = -sum p log p, log p = s - log Z (no cancellation
                shifted = s - log_z[part, None]  # of two large terms: log Z - E_p[s])
                entropy[part] = -(torch.exp(shifted) * shifted).sum(-1)
        ctx.save_for_backward(logits, labels, log_z, entropy)
        ctx.temperature, ctx.rows, ctx.entropy_grad = temperature, rows, entropy_grad
        ctx.mark_non_differentiable(*(() if entropy_grad else (entropy,)))
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, labels, log_z, entropy = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        with_h = ctx.entropy_grad and grad_entropy is not None
        if grad_logp is None:  # only the entropy was used
            grad_logp = log_z.new_zeros(log_z.shape)
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], rows):
            part = slice(start, min(start + rows, logits.shape[0]))
            s = _scaled(logits[part], temperature)
            shifted = s - log_z[part, None]  # (r, V): log p
            probs = torch.exp(shifted)
            g = probs * -grad_logp[part, None]
            g.scatter_add_(-1, labels[part, None], grad_logp[part, None])
            if with_h:  # dH/ds = -p (s - E_p[s]) = -p (log p + H)
                g -= probs * (shifted + entropy[part, None]) * grad_entropy[part, None]
            if temperature != 1.0:
                g /= temperature
            grad[part] = g
        return grad, None, None, None, None, None
