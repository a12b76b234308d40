"""A sampler's reload of a checkpoint version: one read of the weights file, a crc32 check,
tensors that are views of the bytes read, copied in place into the running model.

:func:`mgrpo.models.checkpoint.read_checkpoint_dir` verifies every file of a version by its
sha256 and deserialises the weights into new tensors; at ~100M parameters on this project's
CPUs the sha256 alone is about two thirds of a reload (docs/benchmarks.md "Weight sync").
A sampler needs only the weights file, and only protection against a torn or corrupted file:
:func:`read_weights` reads that one file into one buffer (``readinto``, no second copy),
checks its size and the crc32 the manifest records beside the sha256 (``zlib.crc32``, ~10x
the sha256's speed; a check against accidents, not tampering: the checkpoint folder is
written by the trainer of the same deployment), and returns tensors that are views of the
buffer (the safetensors header gives each tensor's dtype, shape and byte range). The engine
then copies them into its parameters (``load_state_dict``: ``copy_`` in place, no new
module). A version without a crc32 (written before, or by a writer that records only the
sha256) or on a remote filesystem is read by :func:`read_checkpoint_dir`, sha256 and all.

What this module does NOT do: write checkpoints, verify the tokenizer or config files (a
sampler keeps its own), or resume a trainer (``mgrpo.models.checkpoint.load_checkpoint``).
"""

from __future__ import annotations

import json
import zlib

import torch

from mgrpo.models.checkpoint import (
    MANIFEST,
    CheckpointError,
    _fs_and_path,
    _is_local,
    read_checkpoint_dir,
)

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool}


def weights_file(manifest: dict) -> str:
    return "adapter_model.safetensors" if manifest["kind"] == "lora" else "model.safetensors"


def tensors_of(buffer: bytearray) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in ``buffer``, as views of it (no copy)."""
    size = int.from_bytes(buffer[:8], "little")
    header = json.loads(bytes(buffer[8:8 + size]))
    base, state = 8 + size, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // dtype.itemsize
        if count == 0:
            state[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        state[name] = torch.frombuffer(buffer, dtype=dtype, count=count,
                                       offset=base + start).view(info["shape"])
    return state


def read_weights(uri: str) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, manifest) of version directory ``uri`` for a sampler (module docstring).

    Raises :class:`CheckpointError` when the manifest is missing or the weights file is
    missing, of another size, or fails its crc32."""
    fs, path = _fs_and_path(uri)
    if not _is_local(fs):
        return read_checkpoint_dir(uri)
    try:
        with open(f"{path}/{MANIFEST}", "rb") as handle:
            manifest = json.loads(handle.read())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{uri} has no {MANIFEST}: the checkpoint is missing or was "
                              "not completely written; load another version") from exc
    filename = weights_file(manifest)
    entry = manifest["files"][filename]
    if "crc32" not in entry:
        return read_checkpoint_dir(uri)
    buffer = bytearray(entry["size"])
    try:
        with open(f"{path}/{filename}", "rb") as handle:
            got = handle.readinto(buffer)
            extra = handle.read(1)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{uri}: {filename} listed in the manifest is missing") from exc
    crc = zlib.crc32(buffer)
    if got != entry["size"] or extra or crc != entry["crc32"]:
        raise CheckpointError(
            f"{uri}: {filename} is corrupted (crc32 {crc:08x}, size {got + len(extra)}"
            f"{'+' if extra else ''}; manifest says {entry['crc32']:08x}, size "
            f"{entry['size']}); do not use it, load another version")
    state = tensors_of(buffer)
    for dropped, kept in manifest.get("aliases", {}).items():
        state[dropped] = state[kept]
    return state, manifest
