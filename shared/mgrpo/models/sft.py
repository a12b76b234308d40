"""Supervised warm start: next-token loss on an agent's own tokens in expert transcripts.

Data: JSONL, one object per line, written by the environment's scripted experts::

    {"agent": "planner", "segments": [{"text": "...", "train": false},
                                      {"text": "...", "train": true}, ...]}

or TRL's conversational format, ``{"messages": [{"role": ..., "content": ...}, ...]}`` (and
optionally ``"tools"`` and ``"agent"``): :func:`messages_segments` renders it with the
tokenizer's chat template, the assistant turns as ``train`` segments (assistant-only loss,
TRL's ``assistant_only_loss``) and everything else, the generation prompt included, as
context.

Each segment is tokenised SEPARATELY, with no special-token insertion, and the ids are
concatenated (:func:`encode_segments`): the episode runner builds contexts the same way, so
SFT and RL see identical token sequences. The loss is the token mean of ``-log p`` over the
tokens of ``train: true`` segments in the batch (the agent's generations; prompts and tool
observations are context only)::

    L = - sum_{b,t} m_{b,t} log p(x_{b,t} | x_{b,<t}) / sum_{b,t} m_{b,t}

Gradients are accumulated over micro-batches, each scaled by the GLOBAL token count, so the
update does not depend on the micro-batch size (tested: 1x8 == 8x1).

Options for a real model (:class:`SFTConfig`): ``dtype: bfloat16`` (autocast over float32
master weights, as the RL trainer), ``gradient_checkpointing``, ``micro_batch_size``,
``max_length``, ``log_every`` (a log line every N steps on stderr, terminal or not). LoRA:
the caller wraps the model (``mgrpo sft --lora-r``, ``mgrpo.models.lora``).

What it does NOT do: packing, distributed training.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, ValidationError

from mgrpo.models.logprobs import right_pad, token_logprobs
from mgrpo.progress import format_line, log_line, progress_bar
from mgrpo.validation import StrictModel


class SFTSegment(BaseModel):
    text: str
    train: bool = False


class SFTExample(BaseModel):
    agent: str
    segments: list[SFTSegment]


def messages_segments(tokenizer, messages: list[dict], tools: list | None = None
                      ) -> list[SFTSegment]:
    """A conversation as segments: each message's rendering delta (``render(m[:i+1]) -
    render(m[:i])``), an assistant message split into its generation prompt (context) and
    the rest (``train``). Raises ValueError for a template that renders an earlier message
    differently once a later one is added."""
    def render(part: list[dict], gen: bool = False) -> str:
        if not part:
            return ""
        return tokenizer.apply_chat_template(part, tools=tools or None, tokenize=False,
                                             add_generation_prompt=gen)

    segments, done = [], ""
    for i, message in enumerate(messages):
        upto = render(messages[: i + 1])
        if not upto.startswith(done):
            raise ValueError("the chat template renders an earlier message differently once "
                             f"message {i} ({message.get('role')}) is added; assistant-only "
                             "loss needs an append-only template")
        if message.get("role") == "assistant":
            prompt = render(messages[:i], gen=True) if i else ""
            if not (prompt.startswith(done) and upto.startswith(prompt)):
                raise ValueError("the chat template's generation prompt is not how it "
                                 f"renders assistant message {i}")
            segments += [SFTSegment(text=prompt[len(done):], train=False),
                         SFTSegment(text=upto[len(prompt):], train=True)]
        else:
            segments.append(SFTSegment(text=upto[len(done):], train=False))
        done = upto
    return [seg for seg in segments if seg.text]


class SFTConfig(StrictModel):
    """Warm-start hyper-parameters."""

    steps: int = Field(200, gt=0, description="optimizer steps")
    batch_size: int = Field(16, gt=0, description="examples per step")
    micro_batch_size: int = Field(8, gt=0, description="examples per forward pass (memory)")
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate (tiny models: 1e-3)")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(10, ge=0, description="linear warm-up, then cosine to 10% of lr")
    grad_clip: float = Field(1.0, gt=0)
    max_length: int = Field(512, gt=1, description="longer examples are cut on the right")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="bfloat16: forward passes under bf16 autocast, float32 master "
        "weights and Adam state (about half the activation memory on CPU and GPU)")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: memory for time")
    log_every: int | None = Field(
        None, gt=0, description="a log line (loss, s/step) every N steps, terminal or not")
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="held-out share for eval loss")
    eval_every: int = Field(50, gt=0)
    agent: str | None = Field(None, description="train only on examples of this agent")
    seed: int = 0


def load_sft_jsonl(path: str | Path, tokenizer=None) -> list[SFTExample]:
    """Read and validate a JSONL transcript file; errors name the line. A ``messages`` line
    (TRL's conversational format) is rendered with ``tokenizer``'s chat template
    (:func:`messages_segments`); its agent is its ``agent`` key, else ``assistant``."""
    examples = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if isinstance(row, dict) and "messages" in row:
                    if tokenizer is None:
                        raise ValueError("a messages line needs the model's tokenizer")
                    row = {"agent": row.get("agent", "assistant"),
                           "segments": messages_segments(tokenizer, row["messages"],
                                                         row.get("tools"))}
                examples.append(SFTExample.model_validate(row))
            except (ValidationError, ValueError, TypeError, KeyError) as exc:
                reason = exc.errors()[0] if isinstance(exc, ValidationError) else exc
                raise ValueError(f"{path}:{number}: not an SFT example ({reason}); "
                                 'expected {"agent": ..., "segments": [{"text": ..., '
                                 '"train": bool}, ...]} or {"messages": [{"role": ..., '
                                 '"content": ...}, ...]}') from exc
    return examples


def encode_segments(tokenizer, segments) -> tuple[list[int], list[int]]:
    """Token ids of the concatenated segments and a loss mask (1 on ``train`` segments).

    ``segments``: SFTSegment objects or dicts with ``text`` and ``train``.
    """
    ids: list[int] = []
    mask: list[int] = []
    for segment in segments:
        seg = segment if isinstance(segment, SFTSegment) else SFTSegment.model_validate(segment)
        seg_ids = tokenizer(seg.text, add_special_tokens=False)["input_ids"]
        ids.extend(seg_ids)
        mask.extend([int(seg.train)] * len(seg_ids))
    return ids, mask


def collate(encoded: list[tuple[list[int], list[int]]], pad_id: int):
    """-> input_ids (B, T), attention_mask (B, T), loss_mask (B, T), right-padded."""
    ids, attention = right_pad([e[0] for e in encoded], pad_id)
    loss_mask, _ = right_pad([e[1] for e in encoded], 0)
    return ids, attention, loss_mask


def masked_nll(model, input_ids, attention_mask, loss_mask, micro_batch_size: int = 8,
               backward: bool = False, dtype: str = "float32") -> float:
    """Token-mean NLL over ``loss_mask`` (see module docstring); with ``backward`` the
    gradient of that mean is accumulated into ``.grad`` micro-batch by micro-batch."""
    total = loss_mask.sum().clamp(min=1).float()
    loss_value = 0.0
    for start in range(0, input_ids.shape[0], micro_batch_size):
        part = slice(start, start + micro_batch_size)
        cast = (torch.autocast(input_ids.device.type, dtype=torch.bfloat16)
                if dtype == "bfloat16" else contextlib.nullcontext())
        with torch.set_grad_enabled(backward), cast:
            logp = token_logprobs(model, input_ids[part], attention_mask[part],
                                  micro_batch_size=micro_batch_size).float()
            loss = -(logp * loss_mask[part]).sum() / total
        if backward:
            loss.backward()
        loss_value += float(loss.detach())
    return loss_value


def default_lr(parameters: int, lora: bool) -> float:
    """The warm start's lr when none is given: 1e-3 under 20M parameters (the tiny models,
    calibrated here), 2e-4 for a LoRA adapter, 2e-5 for full fine-tuning (TRL's default)."""
    if parameters < 20_000_000:
        return 1e-3
    return 2e-4 if lora else 2e-5


def _lr_factor(step: int, config: SFTConfig) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _split(encoded: list, config: SFTConfig) -> tuple[list, list]:
    gen = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(len(encoded), generator=gen).tolist()
    n_eval = int(len(encoded) * config.eval_fraction)
    return [encoded[i] for i in order[n_eval:]], [encoded[i] for i in order[:n_eval]]


def train_sft(model, tokenizer, examples, config: SFTConfig | None = None,
              progress: bool = False, log_name: str | None = None) -> dict:
    """Fine-tune ``model`` in place on ``examples`` (SFTExample or dicts). ``progress``: a
    bar on a terminal; ``log_name``: also a log line on stderr at every evaluation
    (``warm start NAME | step 100/1000 | loss=... | eval_loss=... | 41.2 s``), whatever
    stderr is.

    Returns metrics: ``train_loss`` (one value per step), ``eval_loss`` (list of
    ``[step, loss]``, including step 0 before training and the final step), ``examples``,
    ``train_tokens`` (loss tokens in the training split).
    """
    config = config or SFTConfig()
    parsed = [e if isinstance(e, SFTExample) else SFTExample.model_validate(e) for e in examples]
    if config.agent:
        parsed = [e for e in parsed if e.agent == config.agent]
    encoded = [encode_segments(tokenizer, e.segments) for e in parsed]
    encoded = [(i[:config.max_length], m[:config.max_length]) for i, m in encoded]
    encoded = [e for e in encoded if sum(e[1]) > 0]
    if not encoded:
        raise ValueError(f"no SFT example with trainable tokens (agent filter: {config.agent!r});"
                         " check the data file and the agent name")
    train_set, eval_set = _split(encoded, config)
    pad_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed + 1)
    metrics = {"train_loss": [], "eval_loss": [], "examples": len(encoded),
               "train_tokens": sum(sum(m) for _, m in train_set)}

    clock = [time.perf_counter()]

    def evaluate(step: int) -> None:
        values = {}
        if metrics["train_loss"]:
            values["loss"] = metrics["train_loss"][-1]
        if eval_set:
            model.eval()
            loss = masked_nll(model, *collate(eval_set, pad_id), config.micro_batch_size,
                              dtype=config.dtype)
            metrics["eval_loss"].append([step, loss])
            values["eval_loss"] = loss
        if log_name is not None:
            now = time.perf_counter()
            log_line(format_line(f"warm start {log_name} | step {step}/{config.steps}",
                                 values, now - clock[0]))
            clock[0] = now

    if config.gradient_checkpointing:
        # non-reentrant (as the RL trainer's): no input needs requires_grad, so LoRA works
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    evaluate(0)
    bar = progress_bar(range(config.steps), desc="sft", enabled=progress)
    step_clock = time.perf_counter()
    for step in bar:
        model.train()
        picks = torch.randint(len(train_set), (config.batch_size,), generator=gen).tolist()
        for group in optimizer.param_groups:
            group["lr"] = config.lr * _lr_factor(step, config)
        optimizer.zero_grad(set_to_none=True)
        loss = masked_nll(model, *collate([train_set[i] for i in picks], pad_id),
                          config.micro_batch_size, backward=True, dtype=config.dtype)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        metrics["train_loss"].append(loss)
        bar.set_postfix(loss=f"{loss:.3f}")
        if config.log_every and (step + 1) % config.log_every == 0 and log_name is not None:
            now = time.perf_counter()
            log_line(format_line(f"warm start {log_name} | step {step + 1}/{config.steps}",
                                 {"loss": loss, "s_per_step": (now - step_clock)
                                  / config.log_every}, None))
            step_clock = now
        if (step + 1) % config.eval_every == 0 and step + 1 < config.steps:
            evaluate(step + 1)
    evaluate(config.steps)
    model.eval()
    return metrics


def save_metrics(metrics: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(metrics, indent=2))
