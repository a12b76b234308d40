"""Training-side per-token log-probabilities (teacher forcing), micro-batched.

Alignment convention (matches ``Trajectory.response_mask``)::

    logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])   for t >= 1
    logp[:, 0] = 0                                            (nothing predicts the first token)

Log-probabilities are of ``log_softmax(logits / temperature)`` (over the vocabulary in chunks
of positions by default: :mod:`mgrpo.algo.vocab_logprobs`): temperature 1 (default) is the
model's raw distribution; the trainer passes the run's sampling temperature, so it trains the
distribution the engine sampled from (the torch engine records its logprobs at the same
temperature; see ``mgrpo.engines.torch_engine``).

What it does NOT do: apply masks or reduce. Callers multiply by their ``response_mask`` and
aggregate (``mgrpo.algo``). Padding is expected on the RIGHT (training batches); positions at
padding hold garbage that the caller's mask removes.
"""

from __future__ import annotations

import inspect

import torch

from mgrpo.algo.vocab_logprobs import chunked_logprobs_from_logits, logprobs_from_logits


def takes_logits_to_keep(model) -> bool:
    """Whether ``model``'s forward computes logits only for its last ``logits_to_keep``
    positions (transformers' causal LMs do); a DDP wrapper's ``module``, a LoRA reference's
    ``peft_model`` and a peft model's base model are looked through (each passes the keyword
    on). Anything else (no ``forward`` to read): False, and the logits are sliced instead."""
    inner = getattr(model, "module", model)
    inner = getattr(inner, "peft_model", inner)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    forward = getattr(inner, "forward", None)
    try:
        return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def _micro_batch_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, first: int,
                          with_entropy: bool, temperature: float, entropy_grad: bool,
                          chunked: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp [, entropy] (b, T - first) of the tokens at positions first .. T-1."""
    width = ids.shape[1]
    keep = width - first + 1  # logits at positions first-1 .. T-1 (the last one predicts
    if first > 1 and takes_logits_to_keep(model):  # nothing and is dropped)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False,
                       logits_to_keep=keep).logits  # (b, keep, V)
    else:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        logits = logits[:, first - 1:]
    if not chunked:
        return logprobs_from_logits(logits[:, :-1], ids[:, first:], temperature, with_entropy,
                                    entropy_grad)
    # the whole (contiguous) block with a dummy label for the last position: no copy of it
    labels = torch.nn.functional.pad(ids[:, first:], (0, 1))
    logp, entropy = chunked_logprobs_from_logits(logits, labels, temperature, with_entropy,
                                                 entropy_grad)
    return logp[:, :-1], None if entropy is None else entropy[:, :-1]


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   micro_batch_size: int = 8, with_entropy: bool = False,
                   temperature: float = 1.0, entropy_grad: bool = False,
                   first_position: int = 1, chunked: bool = True):
    """Per-token ``log p(x_t | x_<t)`` for a right-padded batch, in micro-batches.

    Args:
        input_ids: (B, T) token ids.
        attention_mask: (B, T), 1 on real tokens; ``None`` = all ones.
        micro_batch_size: rows per forward pass; the result does not depend on it (tested).
        with_entropy: also return the entropy of each predictive distribution (no gradient
            unless ``entropy_grad``).
        temperature: logits are divided by it (> 0); 1 = the raw distribution.
        first_position: only positions t >= it are scored (the earliest response token of a
            training batch); earlier ones are 0, and a model that takes ``logits_to_keep``
            computes no logits for them (the lm_head over the vocabulary is the largest
            matmul of a small model's forward).
        chunked: the vocabulary log-softmax ``chunk_rows`` positions at a time
            (:func:`mgrpo.algo.vocab_logprobs.chunked_logprobs_from_logits`: no (B, T, V)
            float32 temporaries); False = the plain autograd reference (same numbers up to
            float rounding).

    Returns:
        logp (B, T) float32 with ``logp[:, :first_position] = 0``; with ``with_entropy`` a
        tuple ``(logp, entropy)``, entropy (B, T), 0 at the same positions.
        Differentiable: call under ``torch.no_grad()`` when no gradient is wanted.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (greedy has no logprobs)")
    if first_position < 1:
        raise ValueError(f"first_position={first_position} must be >= 1 (nothing predicts "
                         "the first token)")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    first = min(first_position, max(input_ids.shape[1] - 1, 1))
    logp_parts, ent_parts = [], []
    for start in range(0, input_ids.shape[0], micro_batch_size):
        ids = input_ids[start:start + micro_batch_size]
        mask = attention_mask[start:start + micro_batch_size]
        logp, ent = _micro_batch_logprobs(model, ids, mask, first, with_entropy, temperature,
                                          entropy_grad, chunked)
        zeros = logp.new_zeros(ids.shape[0], ids.shape[1] - logp.shape[1])
        logp_parts.append(torch.cat([zeros, logp], dim=1))
        if with_entropy:
            ent_parts.append(torch.cat([zeros, ent], dim=1))
    logp = torch.cat(logp_parts, dim=0)
    if with_entropy:
        return logp, torch.cat(ent_parts, dim=0)
    return logp


def right_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of ids -> right-padded ``input_ids`` (B, T) and ``attention_mask`` (B, T)."""
    if not sequences:
        raise ValueError("right_pad needs at least one sequence")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, :len(seq)] = 1
    return ids, mask
