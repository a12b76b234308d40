"""Load a Hugging Face causal LM and its tokenizer from a local folder; :func:`folder_weights`
gives what an engine's ``load_weights`` takes for a folder (a checkpoint or its state dict).

What it does NOT do: download. ``local_files_only=True`` is always passed, so a hub id or a
missing folder fails at once with :class:`ModelLoadError` instead of trying the network.
"""

from __future__ import annotations

from pathlib import Path

from mgrpo.models.checkpoint import MANIFEST


class ModelLoadError(RuntimeError):
    """A model folder is missing, incomplete or unreadable."""


def resolve_dtype(dtype):
    """``None`` -> float32; a torch dtype or a name (``"bfloat16"``) -> that torch dtype."""
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ModelLoadError(f"dtype={dtype!r} is not a torch dtype; use e.g. 'float32', "
                             "'bfloat16', 'float16' or None")
    return value


def quiet_transformers() -> None:
    """Turn off transformers' own progress bars ("Loading weights", "Writing model shards"):
    they print on every command's stderr, terminal or not, for steps that take well under a
    second; mgrpo's own bars and log lines say what takes long (:mod:`mgrpo.progress`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_model(path: str | Path, device: str = "cpu", dtype=None):
    """Return ``(model, tokenizer)`` from a local Hugging Face folder, model in eval mode.

    The tokenizer always has a pad token (the eos token when the folder defines none), since
    batched generation and training pad.
    """
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(
            f"model folder {str(folder)!r} does not exist; models load from a local folder only "
            "(nothing is downloaded). Create one with `mgrpo models init-tiny --out DIR` or "
            "copy a Hugging Face model folder there")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{str(folder)!r} has no config.json, so it is not a Hugging Face model folder; "
            "point at the folder that holds config.json and the weights")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, dtype=resolve_dtype(dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load the model in {str(folder)!r}: {exc}") from exc
    tokenizer = load_tokenizer(folder)
    model.to(device).eval()
    return model, tokenizer


def load_tokenizer(path: str | Path):
    """The tokenizer of a local model folder alone (an engine that holds the weights
    elsewhere, e.g. a vLLM server, still needs it for prompts), with a pad token as in
    :func:`load_model`."""
    from transformers import AutoTokenizer

    folder = Path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load the tokenizer in {str(folder)!r}: {exc}") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def folder_weights(source: str):
    """What ``engine.load_weights`` takes for ``source``: a checkpoint version directory as
    is (verified on load), a plain Hugging Face folder as its state dict."""
    import json

    import fsspec

    fs, path = fsspec.core.url_to_fs(source)
    path = path.rstrip("/")
    if fs.exists(f"{path}/{MANIFEST}"):
        return source
    # The safetensors files themselves: building a model here (from_pretrained) is not
    # thread-safe, and several services may share a process (embedded mode, tests).
    from safetensors.torch import load as st_load

    index = f"{path}/model.safetensors.index.json"
    shards = (sorted(set(json.loads(fs.cat_file(index))["weight_map"].values()))
              if fs.exists(index) else ["model.safetensors"])
    state: dict = {}
    for shard in shards:
        state.update(st_load(fs.cat_file(f"{path}/{shard}")))
    return state
