"""The frozen reference model of the KL term (``loss.kl_coef > 0``), for both modes.

One per trained model, built on the first update that needs it and kept on the trainer's
model record (``lm.ref_model``, with ``lm.ref_key`` = (run id, resolved reference path,
sharded)): the embedded loop and the distributed trainer service call the same
:func:`reference_for`, which loads it again when the key changes (a trainer service that
moves on to another run, or a run whose ``ref_path`` changed), so no run is anchored to
another run's reference. It is loaded from disk, never copied from the live model, so a
resumed run or a restarted trainer gets the same reference as the first round: the model's
``ref_path`` if set (a local HF folder or a full-weight checkpoint version folder), else its
starting ``path``. A LoRA model (``models.<m>.lora``) is its own reference: the same weights
with the adapter disabled (:class:`AdapterDisabled`), no second copy.

Data parallel (a rank of a torchrun trainer, :mod:`mgrpo.parallel.ranks`): the reference is
sharded the way the policy is. Under FSDP2 (``sharded=True``) every rank loads it and
shards it with the same ``fully_shard`` per decoder layer and root
(:func:`mgrpo.parallel.sharding.shard`), so a rank holds about 1/N of its parameters and its
forward all-gathers one layer at a time, as the policy's does. Under DDP it stays a whole
replica on every rank (the policy is one there too; a frozen model has no gradients for DDP
to synchronise). Either way each rank runs the reference over its own share of the batch
(:func:`mgrpo.training.update.no_grad_logprobs`). With ``loss.kl_in_reward`` the reference
scores the rewards on rank 0 alone, before the update (:func:`reward_kl_penalties`), so it
is a whole model there (``sharded=False``).

Cost: a second copy of the weights (1/N of them per rank under FSDP2; none for LoRA; no
gradients, no optimizer state) and one extra no-grad forward pass over each update's batch
(docs/algorithm.md "KL reference" has the figures). What it does NOT do: serve the
reference from another process.
"""

from __future__ import annotations

import logging
import os

import torch

from mgrpo.algo.kl import sequence_kl_penalty
from mgrpo.algo.kl_control import next_kl_coef
from mgrpo.models import load_model
from mgrpo.models.logprobs import right_pad, token_logprobs
from mgrpo.models.lora import is_lora_model
from mgrpo.parallel.sharding import shard
from mgrpo.training.config import LossConfig, ModelConfig

log = logging.getLogger(__name__)


def load_reference(path: str, device: str | torch.device = "cpu") -> torch.nn.Module:
    """A frozen model from ``path``: eval mode, ``requires_grad = False`` everywhere."""
    model, _ = load_model(path, device=str(device))
    model.eval()
    model.requires_grad_(False)
    return model


class AdapterDisabled:
    """The reference of a LoRA model: a forward pass of the same peft model inside
    ``disable_adapter()``, i.e. its base weights (no second copy of the weights)."""

    def __init__(self, peft_model):
        self.peft_model = peft_model

    def parameters(self):
        return self.peft_model.parameters()

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)


def reference_key(model_cfg: ModelConfig, run_id: str | None,
                  sharded: bool = False) -> tuple[str | None, str, bool]:
    """What a reference is built from: the run, the resolved folder (``ref_path``, else
    ``path``; symlinks and relative paths resolved, so two spellings of one folder agree) and
    whether it is FSDP2-sharded over the ranks."""
    return run_id, os.path.realpath(model_cfg.ref_path or model_cfg.path), sharded


def reference_for(lm, model_cfg: ModelConfig, loss_cfg: LossConfig,
                  run_id: str | None = None, sharded: bool = False) -> torch.nn.Module | None:
    """``lm``'s reference model when the KL is on (in the loss or the reward), else ``None``.
    Built once per (``run_id``, resolved reference path, ``sharded``): a new key loads it
    again. ``sharded``: this is one rank of an FSDP2 job (collective: every rank calls it
    together); the reference is sharded with FSDP2 like the policy, and from then on its
    forwards are collective too. Not for a LoRA model (its reference is the policy itself)."""
    if loss_cfg.kl_coef <= 0:
        return None
    key = reference_key(model_cfg, run_id, sharded)
    ref = getattr(lm, "ref_model", None)
    if ref is not None and getattr(lm, "ref_key", None) == key:
        return ref
    lm.ref_model = None  # drop the old one before loading (two copies may not fit)
    if is_lora_model(lm.model):
        ref = AdapterDisabled(lm.model)
        log.info("model %s: KL reference is its base with the LoRA adapter disabled", lm.name)
    else:
        device = next(lm.model.parameters()).device
        ref = load_reference(key[1], device)
        if model_cfg.dtype == "bfloat16":  # frozen: no float32 master copy needed
            ref = ref.to(torch.bfloat16)
        if sharded:
            ref = shard(ref, "fsdp", str(device))
        log.info("model %s (run %s): KL reference loaded from %s%s", lm.name, run_id, key[1],
                 " (FSDP2-sharded over the ranks)" if sharded else "")
    lm.ref_model, lm.ref_key = ref, key
    return ref


KL_COEF_KEY = "kl_coef"
"""The optimizer param-group key that holds a model's current KL-in-reward coefficient, so it
is saved and restored with the optimizer state in every mode (a single process's
``.optimizer.pt``, embedded or in the trainer service; a ranks trainer's DCP folder) and a
fresh optimizer (a new run) starts again from ``loss.kl_coef``."""


def current_kl_coef(lm, loss) -> float:
    """``lm``'s KL-in-reward coefficient: ``loss.kl_coef`` under ``kl_control: fixed`` or
    before the first adaptive update, else the adaptive controller's value."""
    if loss.kl_control == "fixed" or lm.optimizer is None:
        return loss.kl_coef
    return float(lm.optimizer.param_groups[0].get(KL_COEF_KEY, loss.kl_coef))


def update_kl_coef(lm, loss, penalties: list[float]) -> float:
    """After a round: step ``lm``'s coefficient with the round's ``penalties`` (one per
    sequence, ``coef * sum_t k_t``) by ``loss.kl_control`` (:func:`mgrpo.algo.kl_control.
    next_kl_coef`, the mean sequence KL and the number of sequences) and keep it in the
    optimizer state. Returns the new coefficient."""
    coef = current_kl_coef(lm, loss)
    if loss.kl_control == "fixed" or lm.optimizer is None or not penalties or coef <= 0:
        return coef
    kl = sum(penalties) / len(penalties) / coef
    new = next_kl_coef(loss.kl_control, coef, kl, len(penalties), loss.kl_target,
                       loss.kl_horizon)
    for group in lm.optimizer.param_groups:
        group[KL_COEF_KEY] = new
    return new


def reward_kl_penalties(lm, trajs: list, cfg) -> list[float]:
    """``loss.kl_in_reward``: how much each trajectory's reward falls, ``kl_coef * sum_t k_t``
    over its generated tokens (:func:`mgrpo.algo.kl.sequence_kl_penalty`), with pi the
    sampler's logprobs (``Trajectory.old_logprobs``, at the sampling temperature) and pi_ref
    one no-grad pass of the reference at the same temperature, and the model's current
    coefficient (:func:`current_kl_coef`). Zeros when the KL is off or in the loss."""
    loss = cfg.loss
    if not trajs or not (loss.kl_in_reward and loss.kl_coef > 0):
        return [0.0] * len(trajs)
    mcfg = cfg.models[lm.name]
    ref = reference_for(lm, mcfg, loss, run_id=cfg.name)
    ids, attention = right_pad([t.input_ids for t in trajs], lm.tokenizer.pad_token_id)
    mask, pi = torch.zeros(ids.shape), torch.zeros(ids.shape)
    for row, t in enumerate(trajs):
        mask[row, :len(t.input_ids)] = torch.tensor(t.response_mask, dtype=torch.float32)
        pi[row, :len(t.input_ids)] = torch.tensor(t.old_logprobs, dtype=torch.float32)
    device = next(ref.parameters()).device
    with torch.no_grad():
        ref_logp = token_logprobs(ref, ids.to(device), attention.to(device),
                                  micro_batch_size=mcfg.micro_batch_size,
                                  temperature=cfg.sampling.temperature).float().cpu()
    return sequence_kl_penalty(pi, ref_logp, mask, loss.kl_estimator,
                               current_kl_coef(lm, loss)).tolist()
