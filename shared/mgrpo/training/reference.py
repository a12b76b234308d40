"""The frozen reference model of the KL term (``loss.kl_coef > 0``), for both modes.

One per trained model, built on the first update that needs it and kept on the trainer's
model record (``lm.ref_model``): the embedded loop and the distributed trainer service call
the same :func:`reference_for`. It is loaded from disk, never copied from the live model,
so a resumed run or a restarted trainer gets the same reference as the first round: the
model's ``ref_path`` if set (a local HF folder or a full-weight checkpoint version folder),
else its starting ``path``. A LoRA model (``models.<m>.lora``) is its own reference: the
same weights with the adapter disabled (:class:`AdapterDisabled`), no second copy.

Cost: a second copy of the weights (none for LoRA; no gradients, no optimizer state) in the
trainer's process and one extra no-grad forward pass over each update's batch (docs/algorithm.md
"KL reference" has the figures). What it does NOT do: serve the reference from another
process.
"""

from __future__ import annotations

import logging

import torch

from mgrpo.models.lora import is_lora_model
from mgrpo.training.config import LossConfig, ModelConfig

log = logging.getLogger(__name__)


def load_reference(path: str, device: str | torch.device = "cpu") -> torch.nn.Module:
    """A frozen model from ``path``: eval mode, ``requires_grad = False`` everywhere."""
    from mgrpo.models import load_model

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


def reference_for(lm, model_cfg: ModelConfig, loss_cfg: LossConfig) -> torch.nn.Module | None:
    """``lm``'s reference model when the KL term is on (built once), else ``None``."""
    if loss_cfg.kl_coef <= 0:
        return None
    ref = getattr(lm, "ref_model", None)
    if ref is None and is_lora_model(lm.model):
        ref = lm.ref_model = AdapterDisabled(lm.model)
        log.info("model %s: KL reference is its base with the LoRA adapter disabled", lm.name)
    if ref is None:
        path = model_cfg.ref_path or model_cfg.path
        device = next(lm.model.parameters()).device
        ref = load_reference(path, device)
        lm.ref_model = ref
        log.info("model %s: KL reference loaded from %s", lm.name, path)
    return ref
