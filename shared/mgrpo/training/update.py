"""One model's policy update from its samples (docs/algorithm.md, 'The update'): the trainer's
inner loop.

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
Data parallel (``parallel``, a :class:`mgrpo.parallel.sharding.DataParallel`): every rank
has the same samples in the same order; rank r runs micro-batches r, r+world, ... of each
mini-batch, each loss weighted by its share of the mini-batch exactly as in one process; the
model, sharded by :func:`mgrpo.parallel.sharding.shard`, SUMS its gradients over the ranks
(a ``DistributedDataParallel`` once per mini-batch, ``no_sync`` before; an FSDP2 module's
reduce-scatter after every backward), so the sum is the single process's gradient. Every
rank makes the same number of backward passes (the collectives must match): a rank short of
micro-batches adds a zero-weighted one. The no-grad passes (pi_old, the reference) are split
over the ranks the same way, then summed (:func:`no_grad_logprobs`); the reference itself is
sharded like the policy (an FSDP2 module under FSDP2: :mod:`mgrpo.training.reference`).
:class:`UpdateSpec` holds the settings (built once per run: :meth:`UpdateSpec.for_run`). The
steps, in order: :func:`_no_grad_passes` (pi_old, the reference), :func:`_train_epochs`: per
mini-batch :func:`_optimizer_step` over :func:`_micro_batch_loss`, then
:func:`_rollout_report`.
A micro-batch whose advantages are all zero runs its forward (pi_old, the metrics) without
a backward: its policy gradient is exactly zero (not so with a KL in the loss or an entropy
bonus, which then keep it); with ranks nothing skips (a sharded model reshards in the backward).
Metrics are true totals over micro-batches and ranks (:mod:`mgrpo.training.update_metrics`).
Not here: rewards and advantages (``scoring``), checkpoints, transport.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mgrpo.algo import policy_loss
from mgrpo.algo.rollout_correction import is_weight_metrics, rollout_is_weights, rollout_mismatch
from mgrpo.parallel.sharding import SINGLE, DataParallel
from mgrpo.training.config import LossConfig, ModelConfig, RunConfig
from mgrpo.training.precision import autocast_for, set_step_lr
from mgrpo.training.scoring import Sample
from mgrpo.training.update_forward import LogitsPlan, forward_logprobs
from mgrpo.training.update_metrics import UpdateTotals


def _first_one(mask: list[int]) -> int:
    return next((i for i, m in enumerate(mask) if m), len(mask))


def pad_samples(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to (B, T): input_ids, attention_mask, response_mask, old_logprobs; per row
    (B,): advantages and response_start (the first response position)."""
    width = max(len(s.trajectory.input_ids) for s in samples)
    batch = len(samples)
    out = {
        "input_ids": torch.full((batch, width), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(batch, width, dtype=torch.long),
        "response_mask": torch.zeros(batch, width),
        "old_logprobs": torch.zeros(batch, width),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        # each row's first response position, on the CPU (read without a device sync)
        "response_start": torch.tensor([_first_one(s.trajectory.response_mask)
                                        for s in samples], dtype=torch.long),
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
                     temperature: float, parallel: DataParallel = SINGLE,
                     logits: LogitsPlan | None = None) -> torch.Tensor:
    """logp (B, T) of ``rows`` (others 0) without gradient, in eval mode (no dropout), in
    the micro-batches the training passes use (:func:`micro_batches`). Data parallel: each
    rank runs only its share of the micro-batches (:meth:`DataParallel.mine`; padding passes
    keep the ranks' forward counts equal: DDP and FSDP2 forwards are collective), then a sum
    over the ranks gives every rank every row (each filled by one rank)."""
    out = torch.zeros_like(batch["old_logprobs"])
    if not len(rows):
        return out
    parts = micro_batches(batch["attention_mask"][rows].sum(dim=1).cpu(),
                          mcfg.micro_batch_size, mcfg.micro_batch_tokens)
    mine = parallel.mine(parts)
    was_training = getattr(model, "training", False)  # a LoRA reference has no modes
    if hasattr(model, "eval"):
        model.eval()
    with torch.no_grad():
        for j in range(parallel.passes(parts)):
            sel = rows[mine[j] if j < len(mine) else parts[0]]
            logp = forward_logprobs(model, batch, sel, mcfg.micro_batch_tokens is not None,
                                    temperature, False, logits or LogitsPlan())[0].float()
            if j < len(mine):
                out[sel] = logp
    if hasattr(model, "train"):
        model.train(was_training)
    return parallel.sum(out)


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


@dataclass(frozen=True)
class UpdateSpec:
    """How one model's policy update trains, fixed for the run: built once from the run
    config by :meth:`for_run` (a benchmark or :func:`mgrpo.training.step.grpo_step` builds its
    own).

    ``pad_id``: the tokenizer's pad token (right padding to the batch's width).
    ``temperature``: the sampling temperature; logprobs are of ``softmax(logits / T)``.
    ``norm_length``: Dr. GRPO's constant L (``RunConfig.loss_norm_length()``); needed by
    ``seq-mean-token-sum-norm``, which would otherwise divide by the padded width.
    ``total_steps``: the run's optimizer steps, the span of a linear or cosine learning-rate
    schedule (``RunConfig.optimizer_steps``); each step's rate comes from the optimizer's
    own step count (:func:`mgrpo.training.precision.set_step_lr`).
    ``recompute_old``: pi_old is the trainer's own logprobs (else the sampler's).
    ``reuse_first_pass``: pi_old is the trainer's weights before its first step, so for the
    first mini-batch it is that mini-batch's own forward pass, detached (as TRL does with one
    iteration per generation): no separate no-grad pass over those rows. Only the rows of
    later mini-batches are recomputed up front (none with ``mini_batches=1``). Same numbers
    as ``reuse_first_pass=False`` up to float rounding (tested).
    ``logits``: response-only logits and the chunked vocabulary log-softmax
    (:class:`LogitsPlan`)."""

    model_cfg: ModelConfig
    loss_cfg: LossConfig
    pad_id: int
    temperature: float = 1.0
    norm_length: int | None = None
    total_steps: int | None = None
    recompute_old: bool = True
    reuse_first_pass: bool = True
    logits: LogitsPlan = LogitsPlan()

    def __post_init__(self) -> None:
        if self.loss_cfg.agg == "seq-mean-token-sum-norm" and self.norm_length is None:
            raise ValueError("loss.agg=seq-mean-token-sum-norm needs norm_length (the "
                             "constant generation budget L, RunConfig.loss_norm_length())")

    @classmethod
    def for_run(cls, cfg: RunConfig, model: str, pad_id: int) -> UpdateSpec:
        """Model ``model``'s update in run ``cfg``: its model config, the run's loss, sampling
        temperature, Dr. GRPO length and schedule span."""
        return cls(cfg.models[model], cfg.loss, pad_id, temperature=cfg.sampling.temperature,
                   norm_length=cfg.loss_norm_length(), total_steps=cfg.optimizer_steps(model))

    def fuses_old(self, model: torch.nn.Module) -> bool:
        """Whether the first mini-batch's training forward is its pi_old: only exact when
        that train-mode forward is not random (no dropout)."""
        return self.recompute_old and self.reuse_first_pass and not has_dropout(model)


def policy_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  samples: list[Sample], spec: UpdateSpec,
                  ref_model: torch.nn.Module | None = None,
                  generator: torch.Generator | None = None,
                  parallel: DataParallel = SINGLE) -> dict[str, float]:
    """Train ``model`` on ``samples`` for ``ppo_epochs`` epochs (each reshuffled by
    ``generator`` into ``mini_batches`` optimizer steps, all against one pi_old) as ``spec``
    says; returns the metrics (model-level keys bare, per-agent rollout keys as
    ``agent/...``: see :func:`qualify`). ``ref_model``: the frozen reference, with the KL in
    the loss. ``parallel``: this rank's place in a data-parallel update, ``model`` sharded by
    :func:`mgrpo.parallel.sharding.shard` (the DDP wrapper under DDP)."""
    if spec.loss_cfg.kl_in_loss() and ref_model is None:
        raise ValueError(f"loss.kl_coef={spec.loss_cfg.kl_coef} needs the frozen reference "
                         "model: pass ref_model (mgrpo.training.reference.reference_for)")
    if not samples:
        return {}
    run = _Update.of(samples, spec, parallel, next(model.parameters()).device)
    order = torch.randperm(len(samples), generator=generator)
    minis = _chunks(len(samples), spec.model_cfg.mini_batches)
    fused = spec.fuses_old(model)
    later = order[minis[0].stop:].sort().values if fused else torch.arange(len(samples))
    _no_grad_passes(model, ref_model, run, later)
    totals = _train_epochs(model, optimizer, run, order, minis, fused, generator)
    return {**totals.result(), **_rollout_report(samples, run)}


@dataclass
class _Update:
    """What every step of one :func:`policy_update` reads: the padded batch on the model's
    device (its ``old_logprobs``: pi_old, filled in as it is computed), the sampler's own
    logprobs, each row's length, the reference's logprobs (with the KL in the loss), the
    spec and this rank's place."""

    batch: dict[str, torch.Tensor]
    rollout: torch.Tensor
    lengths: torch.Tensor
    spec: UpdateSpec
    parallel: DataParallel
    ref: torch.Tensor | None = None

    @classmethod
    def of(cls, samples: list[Sample], spec: UpdateSpec, parallel: DataParallel,
           device: torch.device) -> _Update:
        batch = {k: v if k == "response_start" else v.to(device)
                 for k, v in pad_samples(samples, spec.pad_id).items()}
        return cls(batch, batch["old_logprobs"], batch["attention_mask"].sum(dim=1).cpu(),
                   spec, parallel)


def _train_epochs(model, optimizer, run: _Update, order: torch.Tensor, minis: list[slice],
                  fused: bool, generator: torch.Generator | None) -> UpdateTotals:
    """Every epoch's optimizer steps in train mode (the first epoch in ``order``, each later
    one reshuffled), then the metric totals summed over the ranks. ``fused``: the first
    step's forwards are pi_old (no step taken before it)."""
    epochs = run.spec.model_cfg.ppo_epochs
    model.train()
    totals = UpdateTotals()
    totals.epochs = epochs
    for epoch in range(epochs):
        if epoch:
            order = torch.randperm(len(order), generator=generator)
        for number, mini in enumerate(minis):
            fill_old = fused and epoch == 0 and number == 0
            _optimizer_step(model, optimizer, run, order[mini], totals, fill_old)
    if run.parallel.world > 1:
        totals.all_reduce(run.parallel.world)
    model.eval()
    return totals


def _no_grad_passes(model, ref_model, run: _Update, pi_old_rows: torch.Tensor) -> None:
    """Before the first step: the trainer's own pi_old of ``pi_old_rows`` (robust to
    sampler/trainer numeric drift; in eval mode, so dropout adds no noise to the ratio) and,
    with the KL in the loss, the reference's logprobs of every row; each rank computes its
    share of the rows, then every rank has all (:func:`no_grad_logprobs`)."""
    batch, spec = run.batch, run.spec
    with autocast_for(spec.model_cfg, model):
        if spec.recompute_old:
            batch["old_logprobs"] = no_grad_logprobs(
                model, batch, pi_old_rows, spec.model_cfg, spec.temperature, run.parallel,
                spec.logits) * batch["response_mask"]
        if spec.loss_cfg.kl_in_loss():
            run.ref = no_grad_logprobs(ref_model, batch, torch.arange(len(run.rollout)),
                                       spec.model_cfg, spec.temperature, run.parallel,
                                       spec.logits)
            if hasattr(ref_model, "reshard"):  # FSDP2 keeps the root's parameters gathered
                ref_model.reshard()  # after a forward (for a backward): free them now


def _optimizer_step(model, optimizer, run: _Update, idx: torch.Tensor, totals: UpdateTotals,
                    fill_old: bool) -> None:
    """One optimizer step on the rows ``idx``: this rank's micro-batches, each loss weighted
    by its share of the mini-batch (token-mean: of its tokens; seq-mean modes: of its
    sequences) so the gradient summed over micro-batches and ranks is the mini-batch's; then
    gradient clip, the schedule's rate, step. ``fill_old``: these forwards are pi_old (the
    fused first pass), stored into the batch and then shared by the ranks."""
    mask, cfg, parallel = run.batch["response_mask"], run.spec.model_cfg, run.parallel
    tokens, seqs = mask[idx].sum().clamp(min=1), len(idx)
    optimizer.zero_grad(set_to_none=True)
    micros = micro_batches(run.lengths[idx], cfg.micro_batch_size, cfg.micro_batch_tokens)
    mine, passes = parallel.mine(micros), parallel.passes(micros)
    advantages = run.batch["advantages"]
    # one process only: with ranks every pass runs its backward, since a sharded model
    # (FSDP2) reshards its parameters in the backward's hooks and a forward alone would
    # leave them gathered
    skips = zero_advantage_skips(run.spec.loss_cfg) and parallel.world == 1
    skip_all = skips and not bool(advantages[idx].any())
    skipped = 0
    for j in range(passes):  # the same number of passes on every rank
        real = j < len(mine)  # else a zero-weighted pass: DDP's and FSDP2's are collective
        sel = idx[mine[j] if real else micros[0]]
        m = mask[sel]
        share = (m.sum() / tokens) if run.spec.loss_cfg.agg == "token-mean" \
            else len(sel) / seqs
        share = share if real else share * 0.0
        if skip_all or (skips and real and not bool(advantages[sel].any())):
            # a zero gradient: the forward gives pi_old and the metrics, no backward
            with torch.no_grad():
                _, metrics = _micro_batch_loss(model, run, sel, real, fill_old)
            skipped += 1
        else:
            with parallel.accumulating(model, last=j == passes - 1):
                loss, metrics = _micro_batch_loss(model, run, sel, real, fill_old)
                (loss * share).backward()
        totals.add_micro(metrics, share, m.sum() if real else 0.0)  # tensors: no host read
    if skipped == passes:  # the optimizer steps on zero gradients, as after a backward
        for param in model.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
    if fill_old and parallel.world > 1:  # each rank filled the rows it ran; later passes
        old = run.batch["old_logprobs"]  # need all of them
        old[idx] = parallel.sum(old[idx].contiguous())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    set_step_lr(optimizer, cfg, run.spec.total_steps)
    optimizer.step()
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    totals.add_step(grad_norm.detach())


def zero_advantage_skips(loss_cfg: LossConfig) -> bool:
    """Whether a micro-batch whose advantages are all zero may skip its backward: its policy
    gradient is exactly zero, so only a KL in the loss or an entropy bonus (gradients that do
    not scale with the advantage) would make its backward count."""
    return not loss_cfg.kl_in_loss() and loss_cfg.entropy_coef == 0


def _micro_batch_loss(model, run: _Update, sel: torch.Tensor, real: bool, fill_old: bool
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of rows ``sel`` (unweighted) and its metrics: a forward under the
    model's autocast, pi_old (:func:`_pi_old`), the truncated rollout IS weights
    (:func:`_rollout_is`), the KL against the reference's logprobs."""
    batch, spec, loss_cfg = run.batch, run.spec, run.spec.loss_cfg
    with autocast_for(spec.model_cfg, model):
        logp, entropy = forward_logprobs(
            model, batch, sel, spec.model_cfg.micro_batch_tokens is not None,
            spec.temperature, loss_cfg.entropy_coef > 0, spec.logits)
    m = batch["response_mask"][sel]
    old = _pi_old(run, sel, logp, real, fill_old)
    return policy_loss(
        logp, old, batch["advantages"][sel], m,
        eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high, agg=loss_cfg.agg,
        ref_logprobs=None if run.ref is None else run.ref[sel],
        kl_coef=0.0 if run.ref is None else loss_cfg.kl_coef,
        kl_estimator=loss_cfg.kl_estimator, norm_length=spec.norm_length,
        entropy=entropy, is_weights=_rollout_is(run, old, sel), entropy_coef=loss_cfg.entropy_coef,
        tensor_metrics=True)


def _pi_old(run: _Update, sel: torch.Tensor, logp: torch.Tensor, real: bool,
            fill_old: bool) -> torch.Tensor:
    """pi_old of rows ``sel``: the stored one, after storing this forward's (detached) when
    ``fill_old``; a padding pass (not ``real``) takes its own detached forward."""
    m = run.batch["response_mask"][sel]
    if fill_old and real:
        run.batch["old_logprobs"][sel] = logp.detach() * m
    return run.batch["old_logprobs"][sel] if real else logp.detach() * m


def _rollout_is(run: _Update, old: torch.Tensor, sel: torch.Tensor) -> torch.Tensor | None:
    """The truncated pi_old / pi_rollout weights of rows ``sel`` (``loss.rollout_is``); None
    without ``recompute_old`` (pi_old is then the rollout's own)."""
    if not run.spec.recompute_old:
        return None
    loss_cfg = run.spec.loss_cfg
    return rollout_is_weights(old, run.rollout[sel], run.batch["response_mask"][sel],
                              loss_cfg.is_level(), loss_cfg.rollout_is_threshold)


def _rollout_report(samples: list[Sample], run: _Update) -> dict[str, float]:
    """With ``recompute_old`` (pi_old of every row known now: the fused rows were filled in
    the first step): the sampler/trainer mismatch per agent and the rollout IS weights'
    statistics."""
    if not run.spec.recompute_old:
        return {}
    loss_cfg = run.spec.loss_cfg
    old, mask = run.batch["old_logprobs"], run.batch["response_mask"]
    out = _rollout_metrics(samples, old.cpu(), run.rollout.cpu(), mask.cpu())
    is_w = rollout_is_weights(old, run.rollout, mask, loss_cfg.is_level(),
                              loss_cfg.rollout_is_threshold)
    if is_w is not None:
        out.update(is_weight_metrics(is_w, mask, loss_cfg.rollout_is_threshold))
    return out
