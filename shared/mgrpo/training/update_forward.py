"""One micro-batch's forward for the policy update: its token logprobs and entropy.

:class:`LogitsPlan` says how (logits only from the earliest response position, the chunked
vocabulary log-softmax); :func:`forward_logprobs` runs it on rows of a padded update batch
(:func:`mgrpo.training.update.pad_samples`). What it does NOT do: losses, masks, backward
(:mod:`mgrpo.training.update`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mgrpo.models.logprobs import token_logprobs


@dataclass(frozen=True)
class LogitsPlan:
    """How a micro-batch's logprobs are computed (:func:`mgrpo.models.logprobs.token_logprobs`).

    ``response_only``: logits only from the micro-batch's earliest response position on
    (``first_position``; the prompt's logits are never read). ``chunked``: the vocabulary
    log-softmax in chunks of positions. Both give the plain path's numbers up to float
    rounding (tested); both off = the plain path, for comparison (``bench/update_mfu.py``)."""

    response_only: bool = True
    chunked: bool = True


def first_response_position(batch: dict, sel: torch.Tensor) -> int:
    """The earliest response position of rows ``sel`` (at least 1; 1 for a batch without
    a response mask: every position scored)."""
    starts = batch.get("response_start")
    if starts is None and "response_mask" not in batch:
        return 1
    if starts is None:  # a batch built elsewhere: read it from the mask (a device sync)
        mask = batch["response_mask"][sel]
        starts = torch.where(mask.any(dim=1), mask.argmax(dim=1), mask.shape[1])
    else:
        sel = sel.cpu()
    return max(1, int(starts[sel].min()))


def forward_logprobs(model, batch: dict, sel: torch.Tensor, trim: bool, temperature: float,
             entropy_grad: bool, plan: LogitsPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """logp and entropy (rows ``sel``, the batch's full width T) of one micro-batch; with
    ``trim`` the forward runs on the micro-batch's own width (right padding cut) and the
    result is padded back with zeros (masked positions)."""
    ids, attention = batch["input_ids"][sel], batch["attention_mask"][sel]
    width = ids.shape[1]
    if trim:
        cut = int(attention.sum(dim=1).max())
        ids, attention = ids[:, :cut], attention[:, :cut]
    first = first_response_position(batch, sel) if plan.response_only else 1
    logp, entropy = token_logprobs(model, ids, attention, micro_batch_size=len(sel),
                                   with_entropy=True, temperature=temperature,
                                   entropy_grad=entropy_grad, first_position=first,
                                   chunked=plan.chunked)
    pad = width - ids.shape[1]
    if pad:
        logp, entropy = (torch.nn.functional.pad(t, (0, pad)) for t in (logp, entropy))
    return logp, entropy
