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
    lr: float = typer.Option(1e-3, "--lr"),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Fine-tune on the agent's own tokens; prints eval loss; writes a checkpoint at the end."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import list_versions, save_checkpoint
    from mgrpo.models.sft import SFTConfig, load_sft_jsonl, train_sft

    if version in list_versions(str(out), name):
        raise typer.BadParameter(f"{out}/{name} has version {version} already; checkpoints are "
                                 "written once: pass another --version", param_hint="--version")
    net, tokenizer = load_model(model, device=device)
    config = SFTConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, agent=agent)
    metrics = train_sft(net, tokenizer, load_sft_jsonl(data), config, progress=True,
                        log_name=name)
    uri = save_checkpoint(net, str(out), name, version, tokenizer=tokenizer,
                          extra={"sft": config.model_dump(), "eval_loss": metrics["eval_loss"]})
    summary = {"checkpoint": uri, "examples": metrics["examples"],
               "eval_loss": metrics["eval_loss"],
               "final_train_loss": metrics["train_loss"][-1]}
    typer.echo(json.dumps(summary))
