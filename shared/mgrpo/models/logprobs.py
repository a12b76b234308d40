"""Training-side per-token log-probabilities (teacher forcing), micro-batched.

Alignment convention (matches ``Trajectory.response_mask``)::

    logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])   for t >= 1
    logp[:, 0] = 0                                            (nothing predicts the first token)

Log-probabilities are of ``log_softmax(logits / temperature)``: temperature 1 (default) is the
model's raw distribution; the trainer passes the run's sampling temperature, so it trains the
distribution the engine sampled from (the torch engine records its logprobs at the same
temperature; see ``mgrpo.engines.torch_engine``).

What it does NOT do: apply masks or reduce. Callers multiply by their ``response_mask`` and
aggregate (``mgrpo.algo``). Padding is expected on the RIGHT (training batches); positions at
padding hold garbage that the caller's mask removes.
"""

from __future__ import annotations

import torch


def _logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool,
                          temperature: float = 1.0, entropy_grad: bool = False,
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` (B, L, V), ``targets`` (B, L) -> logp (B, L) [, entropy (B, L)].

    ``logp = logits[target] - logsumexp(logits)``: avoids materialising a (B, L, V)
    log-softmax, which matters for real vocabularies (150k). Entropy is a diagnostic,
    computed without gradient (no (B, L, V) graph kept for it), unless ``entropy_grad``
    (an entropy bonus in the loss).
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)  # (B, L)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        with torch.enable_grad() if entropy_grad else torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # H = log Z - sum_v p_v * logit_v
            entropy = log_z - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   micro_batch_size: int = 8, with_entropy: bool = False,
                   temperature: float = 1.0, entropy_grad: bool = False):
    """Per-token ``log p(x_t | x_<t)`` for a right-padded batch, in micro-batches.

    Args:
        input_ids: (B, T) token ids.
        attention_mask: (B, T), 1 on real tokens; ``None`` = all ones.
        micro_batch_size: rows per forward pass; the result does not depend on it (tested).
        with_entropy: also return the entropy of each predictive distribution (no gradient
            unless ``entropy_grad``).
        temperature: logits are divided by it (> 0); 1 = the raw distribution.

    Returns:
        logp (B, T) float32 with ``logp[:, 0] = 0``; with ``with_entropy`` a tuple
        ``(logp, entropy)``, entropy (B, T) with ``entropy[:, 0] = 0``.
        Differentiable: call under ``torch.no_grad()`` when no gradient is wanted.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (greedy has no logprobs)")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    logp_parts, ent_parts = [], []
    for start in range(0, input_ids.shape[0], micro_batch_size):
        ids = input_ids[start:start + micro_batch_size]
        mask = attention_mask[start:start + micro_batch_size]
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (b, T, V)
        logp, ent = _logprobs_from_logits(logits[:, :-1], ids[:, 1:], with_entropy, temperature,
                                         entropy_grad)
        zeros = logp.new_zeros(ids.shape[0], 1)
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
