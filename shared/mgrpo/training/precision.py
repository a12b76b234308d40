"""What a model config asks of the trainer besides the loss: the optimizer (Adam or AdamW),
the learning rate of each step (``mgrpo.algo.schedules``), bf16 autocast and gradient
checkpointing. One place, used by the embedded loop, the trainer service and every rank.

bf16 here is mixed precision: the weights, gradients and optimizer moments stay float32
(master weights); the trained model's forward passes run under ``torch.autocast(bfloat16)``
on the model's device (CPU or GPU), and the frozen KL reference is held in bfloat16.

What it does NOT do: fp16 loss scaling (bf16 needs none), or load weights.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from mgrpo.algo.schedules import lr_at
from mgrpo.models.lora import trainable_parameters
from mgrpo.training.config import ModelConfig


def fused_kwargs(params: list[torch.Tensor]) -> dict[str, bool]:
    """``{"fused": True}`` when torch's fused Adam kernel takes every parameter: plain
    (unsharded) float tensors on the CPU or a GPU; else ``{}`` (torch's default step).

    Why: one kernel per parameter instead of a dozen elementwise passes, several times
    faster than the default (for-loop) step on one CPU thread (docs/benchmarks.md, the
    SmolLM2-135M update). The same update up to float rounding (an ulp-scale difference in
    the weights: ``tests/unit/training/test_training_precision.py`` asserts 1e-6 after
    five steps). FSDP2's sharded parameters (DTensors) keep the default step."""
    plain = all(type(p.data) is torch.Tensor and p.is_floating_point()
                and p.device.type in ("cpu", "cuda") for p in params)
    return {"fused": True} if params and plain else {}


def make_optimizer(model: torch.nn.Module, mcfg: ModelConfig) -> torch.optim.Optimizer:
    """Adam over the trainable parameters (AdamW with ``weight_decay`` > 0), at ``lr``;
    fused where it can be (:func:`fused_kwargs`)."""
    params = list(trainable_parameters(model))
    if mcfg.weight_decay > 0:
        return torch.optim.AdamW(params, lr=mcfg.lr, weight_decay=mcfg.weight_decay,
                                 **fused_kwargs(params))
    return torch.optim.Adam(params, lr=mcfg.lr, **fused_kwargs(params))


def prepare_for_training(model: torch.nn.Module, mcfg: ModelConfig) -> torch.nn.Module:
    """Turn on gradient checkpointing when asked (Hugging Face's, non-reentrant, so no input
    needs ``requires_grad`` and LoRA works); returns ``model``."""
    if mcfg.gradient_checkpointing:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ValueError(f"gradient_checkpointing: {type(model).__name__} has no "
                             "gradient_checkpointing_enable (a Hugging Face model has)")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def optimizer_step_count(optimizer: torch.optim.Optimizer) -> int:
    """Steps the optimizer has taken: Adam's own per-parameter ``step`` (restored with its
    state on resume), 0 before the first."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if step is not None:
                step = step.full_tensor() if hasattr(step, "full_tensor") else step
                return int(float(step))
    return 0


def set_step_lr(optimizer: torch.optim.Optimizer, mcfg: ModelConfig,
                total_steps: int | None) -> float | None:
    """Set every group's rate for the optimizer's next step from the schedule (base rate
    ``mcfg.lr``); returns it. A constant schedule without warm-up leaves the optimizer's own
    rate alone (None)."""
    if mcfg.lr_schedule == "constant" and mcfg.warmup_steps == 0:
        return None
    lr = lr_at(optimizer_step_count(optimizer), mcfg.lr, mcfg.lr_schedule, mcfg.warmup_steps,
               mcfg.lr_total_steps or total_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def autocast_for(mcfg: ModelConfig, model: torch.nn.Module):
    """The context of the trained model's forward passes: bf16 autocast or nothing."""
    if mcfg.dtype != "bfloat16":
        return nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


def fresh_optimizer(previous: torch.optim.Optimizer, model: torch.nn.Module,
                    lr: float) -> torch.optim.Optimizer:
    """A new optimizer of ``previous``'s kind and settings (Adam or AdamW, its weight decay,
    fused or not)
    over ``model``'s trainable parameters, at ``lr``: no moments, no steps."""
    decay = previous.defaults.get("weight_decay", 0.0)
    kind, params = type(previous), list(trainable_parameters(model))
    fused = fused_kwargs(params) if previous.defaults.get("fused") else {}
    if kind is torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay, **fused)
    return kind(params, lr=lr, **fused)


class MasterWeightsAdam:
    """Adam on float32 master copies of a low-precision (bf16) model's parameters.

    The model's forward and backward run in its own dtype (no autocast, no casts of the
    weights per matmul); :meth:`step` casts the gradients to float32, steps Adam (fused where
    it can be) on the master copies, and copies them back into the parameters, rounded. The
    moments and the master weights stay float32, so small updates are not lost to bf16
    rounding. Exposes what the trainer reads of an optimizer (``param_groups``, ``state``,
    ``defaults``, ``zero_grad``, ``step``); the step count is the inner Adam's.

    What it does NOT do: save or load the master copies (``state_dict``), sharded (FSDP2)
    parameters, loss scaling (bf16 needs none).
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        kind = torch.optim.AdamW if weight_decay > 0 else torch.optim.Adam
        self.inner = kind(self.master, lr=lr, weight_decay=weight_decay,
                          **fused_kwargs(self.master))

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    @property
    def defaults(self):
        return self.inner.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for master, p in zip(self.master, self.params, strict=True):
            master.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        torch._foreach_copy_(self.params, self.master)
