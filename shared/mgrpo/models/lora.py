"""LoRA adapters via peft: wrap a model, read and write only the adapter weights.

A run trains a model's adapter when its run config has ``models.<m>.lora`` (a
:class:`LoraSpec`): only the adapter parameters get gradients and optimizer state
(:func:`trainable_parameters`), checkpoints hold only the adapter, and a full-weights load
into a peft model (:func:`load_base_state`: a run's starting folder) replaces the base weights
and resets the adapter to its seeded initial values (``lora_B = 0``: the model then computes
exactly the base model).

What it does NOT do: merge adapters into the base weights (engines serve the peft model as is)
or manage several named adapters (one active adapter per model).
"""

from __future__ import annotations

import sys

from pydantic import Field

from mgrpo.validation import StrictModel


class LoraSpec(StrictModel):
    """LoRA hyper-parameters: low rank ``r`` cuts trainable parameters (and checkpoint size)
    at the cost of capacity; ``alpha / r`` scales the update."""

    r: int = Field(8, gt=0)
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def apply_lora(model, spec: LoraSpec | None = None):
    """Return a peft model with fresh LoRA adapters on ``spec.target_modules``."""
    from peft import LoraConfig, get_peft_model

    spec = spec or LoraSpec()
    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=list(spec.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def trainable_parameters(model) -> list:
    """The parameters an optimizer updates: those with ``requires_grad`` (peft freezes the
    base weights, so a LoRA model gives only its adapter)."""
    return [p for p in model.parameters() if p.requires_grad]


def reset_adapter(model, seed: int = 0) -> None:
    """Re-initialise every LoRA layer as peft does at creation (``lora_A`` random from
    ``seed``, ``lora_B = 0``), so the adapter is the identity again."""
    import torch
    from peft.tuners.lora import LoraLayer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in model.modules():
            if isinstance(module, LoraLayer):
                for name in list(module.lora_A):
                    module.reset_lora_parameters(name, True)


def load_base_state(model, state: dict, seed: int = 0) -> None:
    """Load full (non-peft) weights ``state`` into the base of peft ``model`` and reset its
    adapter (:func:`reset_adapter`). Raises ValueError when the weights do not fit, or when
    the base is shared with other models (:mod:`mgrpo.models.shared_base`) and ``state``
    differs from it: writing it would change every sharer's base. Weights equal to the shared
    base are accepted (nothing is written; the adapter is reset)."""
    import torch

    base = model.get_base_model()
    own = base.state_dict()
    mapped = {}
    for key in own:
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        if plain in state:
            mapped[key] = state[plain]
    tied = set(getattr(base, "_tied_weights_keys", None) or [])
    missing = [k for k in own if ".lora_" not in k and k not in mapped
               and k.replace(".base_layer.", ".") not in tied]
    wanted = {k.replace(".base_layer.", ".") for k in own}
    unexpected = [k for k in state if k not in wanted]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the LoRA model's base: missing={missing[:5]} "
                         f"unexpected={unexpected[:5]}; load weights of the same architecture")
    if shares_base(model):
        changed = [k for k, v in mapped.items()
                   if not torch.equal(own[k], v.to(own[k].device, own[k].dtype))]
        if changed:
            raise ValueError(
                f"these weights differ from the base this LoRA model shares with other models "
                f"(e.g. {[k.replace('.base_layer.', '.') for k in changed[:3]]}); loading them "
                "would change the others' base too: set models.<m>.share_base: false to give "
                "this model its own copy of the base")
    else:
        base.load_state_dict(mapped, strict=False)
    reset_adapter(model, seed)


SHARED_FLAG = "mgrpo_shared_base"
"""Attribute set to True on every model whose base is tied to another model's
(:func:`mgrpo.models.shared_base.share_frozen_base`)."""


def shares_base(model) -> bool:
    """Whether ``model``'s frozen base is tied to another model's."""
    return bool(getattr(model, "__dict__", {}).get(SHARED_FLAG, False))


def is_lora_model(model) -> bool:
    """Whether ``model`` is a peft model. Never imports peft: a peft model exists only once
    peft is imported, so without ``peft`` in ``sys.modules`` the answer is False (importing it
    costs ~0.6 s a process; it was on a distributed round's critical path, in each trainer's
    first weight load)."""
    peft = sys.modules.get("peft")
    cls = getattr(peft, "PeftModel", None) if peft is not None else None
    return cls is not None and isinstance(model, cls)


def adapter_state(model) -> dict:
    """The adapter weights only (what a LoRA checkpoint stores)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state(model, state: dict) -> None:
    """Load adapter weights into a peft model; a non-peft model gets a clear error."""
    from peft import set_peft_model_state_dict

    if not is_lora_model(model):
        raise ValueError("this checkpoint holds LoRA adapter weights but the model has no "
                         "adapters; wrap it with mgrpo.models.lora.apply_lora first")
    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"adapter weights do not fit the model: unexpected={unexpected[:5]}; "
                         "use the same LoraSpec as the checkpoint")
