"""One model's policy update from its samples (SPEC 1.4): the trainer's inner loop.

Samples are padded once to a common length T (on the model's device) and, for each of
``ppo_epochs`` epochs, shuffled and split into ``mini_batches`` optimizer steps, each
accumulated over micro-batches (``micro_batch_size`` rows, or a ``micro_batch_tokens``
budget); forwards run under bf16 autocast with ``dtype: bfloat16``, and each step's learning
rate follows the model's schedule (:mod:`mgrpo.training.precision`). Micro-batch losses are
re-weighted so the accumulated gradient equals the full mini-batch's under every aggregation
mode (token-mean: by token share; seq-mean modes: by sequence share, so Dr. GRPO's B*L
normaliser, L the constant ``norm_length``, holds).
Logprobs are of ``softmax(logits / temperature)``, the run's sampling temperature (the
distribution the engine sampled). The trainer computes pi_old itself, in eval mode (for the
first mini-batch of a model without dropout: its own training forward, detached; no extra
pass); the rollout's own logprobs (``Trajectory.old_logprobs``) are kept to report the
sampler/trainer mismatch per agent and, with ``loss.rollout_is``, to weight the loss by
truncated pi_old / pi_rollout (:mod:`mgrpo.algo.rollout_correction`). With the KL in the
loss the caller passes the frozen reference (:mod:`mgrpo.training.reference`).
Data parallel (``shard=(rank, world)``, :mod:`mgrpo.parallel.ranks`): every rank has
the same samples in the same order; rank r runs micro-batches r, r+world, ... of each
mini-batch, the model is a ``DistributedDataParallel`` whose all-reduce (an average) syncs the
gradients once per mini-batch (``no_sync`` before), or an FSDP2 module whose reduce-scatter
(an average too) runs after every backward; the local loss is multiplied by ``world``
so the average equals the single-process sum. Every rank makes the same number of backward
passes (DDP's collectives must match): a rank short of micro-batches adds a zero-weighted one.
The no-grad passes (pi_old, the reference) are split over the ranks the same way, then
all-reduced (:func:`no_grad_logprobs`); the reference itself is sharded like the policy (an
FSDP2 module under FSDP2: :mod:`mgrpo.training.reference`).
Metrics are true totals over micro-batches and ranks (:mod:`mgrpo.training.update_metrics`).
Not here: rewards and advantages (``scoring``), checkpoints, transport.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from mgrpo.algo import policy_loss
from mgrpo.algo.rollout_correction import is_weight_metrics, rollout_is_weights, rollout_mismatch
from mgrpo.models.logprobs import token_logprobs
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.precision import autocast_for, set_step_lr
from mgrpo.training.scoring import Sample
from mgrpo.training.update_metrics import UpdateTotals


def pad_samples(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to (B, T): input_ids, attention_mask, response_mask, old_logprobs, advantages."""
    width = max(len(s.trajectory.input_ids) for s in samples)
    batch = len(samples)
    out = {
        "input_ids": torch.full((batch, width), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(batch, width, dtype=torch.long),
        "response_mask": torch.zeros(batch, width),
        "old_logprobs": torch.zeros(batch, width),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    }
    for i, s in enumerate(samples):
        t = s.trajectory
        n = len(t.input_ids)
        out["input_ids"][i, :n] = torch.tensor(t.input_ids)
        out["attention_mask"][i, :n] = 1
        out["response_mask"][i, :n] = torch.tensor(t.response_mask, dtype=torch.float32)
        out["old_logprobs"][i, :n] = torch.tensor(t.old_logprobs)
    return out


def _chunks(n: int, parts: int) -> list[slice]:
    size = -(-n // parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _gather_first_rows(batch: dict, first_rows) -> None:
    """After a data-parallel update: the first mini-batch's fused pi_old rows, each filled by
    the one rank that ran them (the others hold zeros there)."""
    import torch.distributed as dist

    part = batch["old_logprobs"][first_rows].contiguous()
    dist.all_reduce(part)
    batch["old_logprobs"][first_rows] = part


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a train-mode forward of ``model`` is random: a dropout module with p > 0 (LoRA
    dropout, hidden dropout) or an attention dropout in its config."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
           for m in model.modules()):
        return True
    config = getattr(getattr(model, "module", model), "config", None)  # DDP: .module
    return any(float(getattr(config, name, 0.0) or 0.0) > 0
               for name in ("attention_dropout", "hidden_dropout", "dropout"))


def no_grad_logprobs(model, batch: dict, rows: torch.Tensor, mcfg: ModelConfig,
                     temperature: float, shard: tuple[int, int] = (0, 1)) -> torch.Tensor:
    """logp (B, T) of ``rows`` (others 0) without gradient, in eval mode (no dropout), in
    the micro-batches the training passes use (:func:`micro_batches`). Data parallel
    (``shard = (rank, world)``): each rank runs only micro-batches rank, rank + world, ...
    (padding passes keep the ranks' forward counts equal: DDP and FSDP2 forwards are
    collective), then an all-reduce gives every rank every row (each filled by one rank)."""
    out = torch.zeros_like(batch["old_logprobs"])
    if not len(rows):
        return out
    rank, world = shard
    parts = micro_batches(batch["attention_mask"][rows].sum(dim=1).cpu(),
                          mcfg.micro_batch_size, mcfg.micro_batch_tokens)
    mine = parts[rank::world]
    was_training = getattr(model, "training", False)  # a LoRA reference has no modes
    if hasattr(model, "eval"):
        model.eval()
    with torch.no_grad():
        for j in range(-(-len(parts) // world)):
            sel = rows[mine[j] if j < len(mine) else parts[0]]
            logp = _forward(model, batch, sel, mcfg.micro_batch_tokens is not None,
                            temperature, False)[0].float()
            if j < len(mine):
                out[sel] = logp
    if hasattr(model, "train"):
        model.train(was_training)
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(out)
    return out


def qualify(metrics: dict[str, float], model: str) -> dict[str, float]:
    """Prefix :func:`policy_update`'s model-level keys with ``model/``; per-agent keys
    (already ``agent/...``) stay as they are."""
    return {(key if "/" in key else f"{model}/{key}"): value for key, value in metrics.items()}


def _rollout_metrics(samples: list[Sample], train: torch.Tensor, rollout: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """Per agent: mean/max |logp_train - logp_rollout| and KL(rollout || train) (k3)."""
    out: dict[str, float] = {}
    for agent in sorted({s.trajectory.agent for s in samples}):
        rows = torch.tensor([s.trajectory.agent == agent for s in samples])
        for key, value in rollout_mismatch(train[rows], rollout[rows], mask[rows]).items():
            out[f"{agent}/rollout_{key}" if key != "rollout_kl" else f"{agent}/{key}"] = value
    return out


def micro_batches(lengths: torch.Tensor, size: int, budget: int | None) -> list[slice]:
    """Consecutive slices of a mini-batch's rows (``lengths``: each row's token count): by
    count, ``size`` rows each (as even as possible), or with a token ``budget``: a slice
    grows while (rows x its longest row) stays within it, at most ``size`` rows, at least
    one row."""
    n = len(lengths)
    if budget is None:
        return _chunks(n, -(-n // size))
    out, start = [], 0
    while start < n:
        end, width = start + 1, int(lengths[start])
        while end < n and end - start < size \
                and (end - start + 1) * max(width, int(lengths[end])) <= budget:
            width = max(width, int(lengths[end]))
            end += 1
        out.append(slice(start, end))
        start = end
    return out


def _forward(model, batch: dict, sel: torch.Tensor, trim: bool, temperature: float,
             entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logp and entropy (rows ``sel``, the batch's full width T) of one micro-batch; with
    ``trim`` the forward runs on the micro-batch's own width (right padding cut) and the
    result is padded back with zeros (masked positions)."""
    ids, attention = batch["input_ids"][sel], batch["attention_mask"][sel]
    width = ids.shape[1]
    if trim:
        cut = int(attention.sum(dim=1).max())
        ids, attention = ids[:, :cut], attention[:, :cut]
    logp, entropy = token_logprobs(model, ids, attention, micro_batch_size=len(sel),
                                   with_entropy=True, temperature=temperature,
                                   entropy_grad=entropy_grad)
    pad = width - ids.shape[1]
    if pad:
        logp, entropy = (torch.nn.functional.pad(t, (0, pad)) for t in (logp, entropy))
    return logp, entropy


def policy_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  samples: list[Sample], model_cfg: ModelConfig, loss_cfg: LossConfig,
                  pad_id: int, ref_model: torch.nn.Module | None = None,
                  recompute_old: bool = True, generator: torch.Generator | None = None,
                  norm_length: int | None = None, temperature: float = 1.0,
                  reuse_first_pass: bool = True, shard: tuple[int, int] = (0, 1),
                  total_steps: int | None = None) -> dict[str, float]:
    """Train ``model`` on ``samples`` for ``model_cfg.ppo_epochs`` epochs (each reshuffled
    into ``mini_batches`` optimizer steps, all against one pi_old); returns the metrics
    (model-level keys bare, per-agent rollout keys as ``agent/...``: see :func:`qualify`).
    ``norm_length``: Dr. GRPO's constant L (``RunConfig.loss_norm_length()``); needed by
    ``seq-mean-token-sum-norm``, which would otherwise divide by the padded width.
    ``total_steps``: the run's optimizer steps, the span of a linear or cosine learning-rate
    schedule (``RunConfig.optimizer_steps``); each step's rate comes from the optimizer's
    own step count (:func:`mgrpo.training.precision.set_step_lr`).

    ``reuse_first_pass`` (default): pi_old is the trainer's weights before its first step, so
    for the first mini-batch it is that mini-batch's own forward pass, detached (as TRL does
    with one iteration per generation): no separate no-grad pass over those rows. Only the
    rows of later mini-batches are recomputed up front (none with ``mini_batches=1``). Same
    numbers as ``reuse_first_pass=False`` up to float rounding (tested)."""
    if loss_cfg.agg == "seq-mean-token-sum-norm" and norm_length is None:
        raise ValueError("loss.agg=seq-mean-token-sum-norm needs norm_length (the constant "
                         "generation budget L, RunConfig.loss_norm_length())")
    if not samples:
        return {}
    if loss_cfg.kl_in_loss() and ref_model is None:
        raise ValueError(f"loss.kl_coef={loss_cfg.kl_coef} needs the frozen reference model: "
                         "pass ref_model (mgrpo.training.reference.reference_for)")
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in pad_samples(samples, pad_id).items()}
    order = torch.randperm(len(samples), generator=generator)
    minis = _chunks(len(samples), model_cfg.mini_batches)
    rollout = batch["old_logprobs"]  # what the sampler reported
    mask_all = batch["response_mask"]
    # The fused pi_old is a train-mode forward: only exact when that forward is not random.
    fused = recompute_old and reuse_first_pass and not has_dropout(model)
    with autocast_for(model_cfg, model):
        if recompute_old:  # the trainer's own pi_old: robust to sampler/trainer numeric drift
            # Fused: the first mini-batch's pi_old is its own (grad) forward, detached, filled
            # in below; only the rows of later mini-batches need a pass before the first step.
            rows = order[minis[0].stop:].sort().values if fused else torch.arange(len(samples))
            # pi_old in eval mode: dropout (LoRA's, the model's) adds no noise to the ratio
            batch["old_logprobs"] = no_grad_logprobs(model, batch, rows, model_cfg,
                                                     temperature, shard) * mask_all
        ref = None
        if loss_cfg.kl_in_loss():  # each rank computes its share of the rows (then shares)
            ref = no_grad_logprobs(ref_model, batch, torch.arange(len(samples)), model_cfg,
                                   temperature, shard)
            if hasattr(ref_model, "reshard"):  # FSDP2 keeps the root's parameters gathered
                ref_model.reshard()  # after a forward (for a backward): free them now
    model.train()
    totals = UpdateTotals()
    totals.epochs = model_cfg.ppo_epochs
    rank, world = shard
    lengths = batch["attention_mask"].sum(dim=1).cpu()
    for epoch in range(model_cfg.ppo_epochs):
        if epoch:
            order = torch.randperm(len(samples), generator=generator)
        for number, mini in enumerate(minis):
            idx = order[mini]
            first = fused and epoch == 0 and number == 0  # no step taken: these ARE pi_old
            _mini_batch_step(model, optimizer, batch, idx, rollout, ref, model_cfg, loss_cfg,
                             totals, shard, temperature, norm_length, recompute_old, first,
                             lengths, total_steps)
            if first and world > 1:  # each rank filled the rows it ran; later passes need all
                _gather_first_rows(batch, idx)
    if world > 1:
        totals.all_reduce(world)
    extra: dict[str, float] = {}
    if recompute_old:  # pi_old of every row is known now (fused rows were filled in the loop)
        extra = _rollout_metrics(samples, batch["old_logprobs"].cpu(), rollout.cpu(),
                                 mask_all.cpu())
        is_w = rollout_is_weights(batch["old_logprobs"], rollout, mask_all,
                                  loss_cfg.rollout_is, loss_cfg.rollout_is_threshold)
        if is_w is not None:
            extra.update(is_weight_metrics(is_w, mask_all, loss_cfg.rollout_is_threshold))
    model.eval()
    return {**totals.result(), **extra}


def _mini_batch_step(model, optimizer, batch: dict, idx: torch.Tensor, rollout, ref,
                     model_cfg: ModelConfig, loss_cfg: LossConfig, totals: UpdateTotals,
                     shard: tuple[int, int], temperature: float, norm_length: int | None,
                     recompute_old: bool, fill_old: bool, lengths: torch.Tensor,
                     total_steps: int | None) -> None:
    """One optimizer step on the rows ``idx``: micro-batch forwards and backwards (this
    rank's share), gradient clip, the schedule's rate, step. ``fill_old``: this mini-batch's
    forwards are pi_old (the fused first pass), stored into ``batch["old_logprobs"]``."""
    mask_all = batch["response_mask"]
    tokens, seqs = mask_all[idx].sum().clamp(min=1), len(idx)
    optimizer.zero_grad(set_to_none=True)
    micros = micro_batches(lengths[idx], model_cfg.micro_batch_size,
                           model_cfg.micro_batch_tokens)
    rank, world = shard
    mine = micros[rank::world]
    passes = -(-len(micros) // world)
    for j in range(passes):  # the same number of passes on every rank
        real = j < len(mine)
        sel = idx[mine[j] if real else micros[0]]
        # DDP: no all-reduce before the last micro-batch (forward AND backward); FSDP2
        # reduce-scatters every backward (its gradients stay sharded), so no no_sync
        no_sync = getattr(model, "no_sync", None)
        sync = world == 1 or j == passes - 1
        with nullcontext() if sync or no_sync is None else no_sync():
            with autocast_for(model_cfg, model):
                logp, entropy = _forward(model, batch, sel,
                                         model_cfg.micro_batch_tokens is not None,
                                         temperature, loss_cfg.entropy_coef > 0)
            m = mask_all[sel]
            if fill_old and real:
                batch["old_logprobs"][sel] = logp.detach() * m
            old_sel = batch["old_logprobs"][sel] if real else logp.detach() * m
            is_w = None if not recompute_old else rollout_is_weights(
                old_sel, rollout[sel], m, loss_cfg.rollout_is, loss_cfg.rollout_is_threshold)
            loss, metrics = policy_loss(
                logp, old_sel, batch["advantages"][sel], m,
                eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high, agg=loss_cfg.agg,
                ref_logprobs=None if ref is None else ref[sel],
                kl_coef=0.0 if ref is None else loss_cfg.kl_coef,
                kl_estimator=loss_cfg.kl_estimator, norm_length=norm_length,
                entropy=entropy, is_weights=is_w, entropy_coef=loss_cfg.entropy_coef,
                tensor_metrics=True)
            share = (m.sum() / tokens) if loss_cfg.agg == "token-mean" else len(sel) / seqs
            share = share if real else share * 0.0
            (loss * (share * world) if world > 1 else loss * share).backward()
        totals.add_micro(metrics, share, m.sum() if real else 0.0)  # tensors: no host read
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), model_cfg.grad_clip)
    set_step_lr(optimizer, model_cfg, total_steps)
    optimizer.step()
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    totals.add_step(grad_norm.detach())
