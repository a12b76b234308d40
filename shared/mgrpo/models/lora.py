"""LoRA adapters via peft: wrap a model, read and write only the adapter weights.

What it does NOT do: merge adapters into the base weights (engines serve the peft model as is)
or manage several named adapters (one active adapter per model).
"""

from __future__ import annotations

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


def is_lora_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


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
