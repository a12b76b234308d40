"""The run config's per-model and ``sampling`` sections: one model's path, optimizer,
schedule, precision, batching, LoRA and KL reference (:class:`ModelConfig`), and how
training rollouts are sampled (:class:`SamplingConfig`). Read through
:mod:`mgrpo.training.config`, which holds the whole run config.

What this module does NOT do: load a model (``mgrpo.models``) or build an optimizer
(``mgrpo.training.precision``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mgrpo.models.lora import LoraSpec
from mgrpo.training import aliases
from mgrpo.validation import StrictModel


class ModelConfig(StrictModel):
    """One trainable model. Several agents may share one model (``agents`` mapping)."""

    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.MODEL

    path: str = Field(description="Local HF folder (or checkpoint) to start from.")
    lr: float = Field(2e-4, gt=0, description="Adam lr. Calibrated: 2e-4 stable on tiny "
                      "models; 5e-4 collapsed.")
    grad_clip: float = 1.0
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per epoch over a round's "
                              "samples.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over a round's samples (each "
                            "reshuffled into `mini_batches`), all against the same pi_old: "
                            "mini_batches * ppo_epochs optimizer steps per round (verl "
                            "ppo_epochs, TRL num_iterations).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward.")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="Token budget per forward/backward: a micro-batch takes "
        "sequences while rows x its longest sequence stays within it (at least one; at most "
        "micro_batch_size), and is cut to that width. Same gradient as fixed-size "
        "micro-batches; bounds activation memory on long, uneven rollouts. None: by count.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="bfloat16: the trained model's forward passes run under "
        "torch.autocast(bfloat16) (CPU and GPU) with float32 master weights, gradients and "
        "optimizer state; the frozen KL reference is held in bfloat16. float32: no autocast.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in the backward pass "
        "(Hugging Face gradient_checkpointing_enable, non-reentrant): less memory, about one "
        "more forward of time; same gradients.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning rate per optimizer step after the warm-up "
        "(mgrpo.algo.schedules, Hugging Face's formulas): constant, linear to 0 or cosine to "
        "0 over the run's optimizer steps (lr_total_steps).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up from 0 over this many "
                              "optimizer steps.")
    lr_total_steps: int | None = Field(
        None, ge=1, description="Optimizer steps the linear/cosine schedule spans; None: the "
        "run's, sum of stage rounds x mini_batches x ppo_epochs.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (AdamW); 0 = "
                                "Adam.")
    trainable: bool = Field(True, description="False freezes it (main-only ablation).")
    ref_path: str | None = Field(
        None, description="KL reference (loss.kl_coef > 0): a local HF folder or checkpoint "
        "version folder; default `path`, i.e. the starting weights.")
    max_staleness: int | None = Field(
        None, ge=0, description="Asynchronous mode for this model: how many updates its "
        "trainer may be ahead of the weights that sampled a round (None: the run's "
        "`max_staleness`).")
    max_trajectory_tokens: int = Field(
        32_768, ge=2, description="The longest trajectory (prompt + completions + "
        "observations, in tokens) this model's trainer ingests; a longer one is refused with "
        "the reason (dead-letter queue). An update's memory grows with its longest sequence, "
        "so one hostile or runaway trajectory must not size it.")
    lora: LoraSpec | None = Field(
        None, description="Train a LoRA adapter instead of the full weights, e.g. {r: 8, "
        "alpha: 16, target_modules: [q_proj, v_proj]}: only the adapter is in the optimizer "
        "and in each checkpoint (kind lora), the KL reference is the base with the adapter "
        "disabled, and engines load only the adapter (vllm: enable_lora). None: full weights.")
    share_base: bool = Field(
        True, description="Embedded mode, LoRA models: models with `lora` that load the same "
        "`path` (resolved) with the same `dtype` hold one copy of the frozen base weights "
        "(agents as adapters on one base; each keeps its own adapter, optimizer and "
        "checkpoints; training is unchanged, bit for bit). false: this model loads its own "
        "copy. No effect on full-weight models or in the services (one model per process).")

    @model_validator(mode="after")
    def _lora(self) -> ModelConfig:
        if self.lora is not None and not self.trainable:
            raise ValueError("lora is set on a model with trainable: false; a frozen model "
                             "trains no adapter: drop `lora` or set trainable: true")
        if self.lr_total_steps is not None and self.warmup_steps >= self.lr_total_steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} >= lr_total_steps="
                             f"{self.lr_total_steps}: the warm-up would never end; shorten it")
        if self.lr_schedule == "constant" and self.lr_total_steps is not None:
            raise ValueError(f"lr_total_steps={self.lr_total_steps} with lr_schedule constant "
                             "does nothing; set lr_schedule: linear or cosine, or drop it")
        if self.micro_batch_tokens is not None and not self.trainable:
            raise ValueError("micro_batch_tokens on a model with trainable: false; it is "
                             "never trained: drop micro_batch_tokens")
        if self.lora is not None and self.ref_path is not None:
            raise ValueError(f"ref_path={self.ref_path!r} with lora: the KL reference of a "
                             "LoRA model is its base with the adapter disabled; drop ref_path")
        return self


class SamplingConfig(StrictModel):
    """How training rollouts are sampled. The trainer trains ``softmax(logits / temperature)``,
    the distribution the engine samples from; top-p / top-k truncation is refused because
    the trainer cannot put the tokens outside the kept set back (no correction exists)."""

    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.SAMPLING

    temperature: float = Field(1.0, gt=0, description="> 0; greedy is for evaluation only.")
    top_p: float = 1.0
    top_k: int = 0
    planner_max_turns: int = 5
    subagent_max_turns: int = 3
    max_new_tokens: int = 32  # per turn

    @model_validator(mode="after")
    def _untruncated(self) -> SamplingConfig:
        if self.top_p != 1.0 or self.top_k != 0:
            raise ValueError(
                f"sampling.top_p={self.top_p}, top_k={self.top_k}: training samples must come "
                "from the full softmax at `temperature` (the distribution the trainer trains); "
                "top-p/top-k sampling drops tokens no importance weight can restore. Set "
                "top_p: 1.0 and top_k: 0 (use temperature to sharpen).")
        return self
