"""`mgrpo sft`: supervised warm start of one model on expert transcripts (JSONL)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def sft(
    model: Path = typer.Option(..., "--model", help="Local HF model folder to start from."),
    data: Path = typer.Option(..., "--data", help="JSONL of {agent, segments} transcripts."),
    out: Path = typer.Option(..., "--out", help="Checkpoint root (local path or fsspec URI)."),
    name: str = typer.Option("model", "--name", help="Checkpoint name under --out."),
    version: int = typer.Option(0, "--version", help="Checkpoint version to write (new)."),
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's examples."),
    steps: int = typer.Option(200, "--steps"),
    batch_size: int = typer.Option(16, "--batch-size"),
    micro_batch_size: int = typer.Option(8, "--micro-batch-size", help="Examples per "
                                         "forward/backward (memory)."),
    max_length: int = typer.Option(512, "--max-length", help="Tokens per example (cut on "
                                   "the right)."),
    lr: float | None = typer.Option(
        None, "--lr", help="Peak AdamW lr. Default by what trains: 1e-3 for a model under "
        "20M parameters (the tiny ones), 2e-5 for full fine-tuning of a larger one (TRL's "
        "default), 2e-4 for a LoRA adapter."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, or bfloat16 (autocast "
                              "over float32 master weights)."),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing"),
    lora_r: int | None = typer.Option(
        None, "--lora-r", help="Train a LoRA adapter of this rank (alpha 2r, on the "
        "attention and MLP projections) and merge it into the weights written."),
    log_every: int = typer.Option(10, "--log-every", help="A log line every N steps."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Fine-tune on the agent's own tokens; prints eval loss; writes a checkpoint at the end.
    Data: {agent, segments} lines (mgrpo data demos) or {messages} lines (TRL's
    conversational format, assistant-only loss)."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import list_versions, save_checkpoint
    from mgrpo.models.lora import LoraSpec, apply_lora
    from mgrpo.models.sft import SFTConfig, default_lr, load_sft_jsonl, train_sft
    from mgrpo.models.tiny import count_parameters

    if version in list_versions(str(out), name):
        raise typer.BadParameter(f"{out}/{name} has version {version} already; checkpoints are "
                                 "written once: pass another --version", param_hint="--version")
    net, tokenizer = load_model(model, device=device)
    lr = lr if lr is not None else default_lr(count_parameters(net), lora_r is not None)
    config = SFTConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, agent=agent,
                       micro_batch_size=micro_batch_size, max_length=max_length, dtype=dtype,
                       gradient_checkpointing=gradient_checkpointing, log_every=log_every)
    examples = load_sft_jsonl(data, tokenizer)
    if lora_r is not None:
        net = apply_lora(net, LoraSpec(r=lora_r, alpha=2 * lora_r, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    metrics = train_sft(net, tokenizer, examples, config, progress=True, log_name=name)
    if lora_r is not None:
        net = net.merge_and_unload()
    uri = save_checkpoint(net, str(out), name, version, tokenizer=tokenizer,
                          extra={"sft": {**config.model_dump(), "lora_r": lora_r},
                                 "eval_loss": metrics["eval_loss"]})
    summary = {"checkpoint": uri, "examples": metrics["examples"],
               "eval_loss": metrics["eval_loss"],
               "final_train_loss": metrics["train_loss"][-1]}
    typer.echo(json.dumps(summary))
