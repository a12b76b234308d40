"""Versioned, atomic, checksummed checkpoints over fsspec (local paths, ``file://``, ``memory://``,
object stores).

Layout::

    {root}/{name}/v{version:06d}/
        model.safetensors          full weights (tied duplicates stored once, see "aliases")
        config.json                full weights only: with the tokenizer files the version
                                   directory is itself a Hugging Face folder (load_model works)
        adapter_model.safetensors  LoRA only (peft adapter weights) + adapter_config.json
                                   (its base_model_name_or_path: a local base's absolute path)
        tokenizer files            when a tokenizer is given
        manifest.json              written LAST: name, version, kind, sha256, crc32 + size
                                   per file

Atomicity: everything is written under ``{root}/{name}/.tmp-v{version}-{uuid}/`` and the folder
is renamed into place at the end. A writer killed at any point leaves either no version
directory or a complete one; :func:`latest_version` only counts directories with a manifest,
and loading re-hashes every file (a sampler's reload, ``mgrpo.models.weights_read``, the
weights file by its crc32), so a torn or corrupted checkpoint raises :class:`CheckpointError`
and is never loaded.

Write once: a version directory is never rewritten in place. :func:`save_checkpoint` refuses
an existing version (on local paths the final ``rename`` itself refuses a non-empty target,
so two writers racing for one version cannot mix their files). A complete version that its
owner never committed (the trainer records it in the store last; the embedded loop writes
its state file last) is removed with :func:`discard_version`, which first renames it to a
``.trash-*`` name, so no reader ever sees it half deleted. :func:`clean_leftovers` removes what
killed writers leave behind (``.tmp-*`` and ``.trash-*`` entries); call it when the owner
starts.

Runs: a run's checkpoints live under its own root, :func:`run_root` (``{root}/{run_id}``),
so two runs never share a version directory.

What it does NOT do: optimizer state (``mgrpo.parallel.optimizer_state``), garbage-collect
old versions, or lock against two writers of the same version (one trainer owns one model of
one run). On stores without an atomic rename (``memory://``, S3), ``mv`` is copy-then-delete;
the manifest check still rejects a torn copy.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import fsspec

from mgrpo.models.lora import adapter_state, is_lora_model, load_adapter_state

_VERSION_DIR = re.compile(r"^v(\d{6})$")
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupted."""


class CheckpointDiskFull(CheckpointError):
    """A checkpoint could not be written: no space left where it goes."""


def disk_full(error: OSError, what: str, path: str) -> CheckpointDiskFull | None:
    """A :class:`CheckpointDiskFull` naming ``what`` and the free space at ``path`` when
    ``error`` is ENOSPC (or EDQUOT), else None."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    try:
        free = f"{shutil.disk_usage(path).free} bytes free"
    except OSError:
        free = "free space unknown"
    return CheckpointDiskFull(f"no space left to write {what} under {path} ({free}); free "
                              "space, lower keep_checkpoints or move MGRPO_CHECKPOINT_URI")


def _remove_quietly(fs, path: str) -> None:
    """Remove a failed write's temp file or folder; a second failure changes nothing (the
    owner's next start removes ``.tmp-*`` leftovers anyway)."""
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except OSError:
        pass


def _fs_and_path(uri: str):
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path.rstrip("/")


def run_root(root_uri: str, run_id: str) -> str:
    """The checkpoint root of one run: ``{root}/{run_id}`` (run ids are validated names)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise CheckpointError(f"run id {run_id!r} cannot name a checkpoint folder; use letters, "
                              "digits, '-', '_' or '.' (not first)")
    return f"{root_uri.rstrip('/')}/{run_id}"


def version_uri(root_uri: str, name: str, version: int) -> str:
    """The URI of one version directory (same scheme as ``root_uri``)."""
    return f"{root_uri.rstrip('/')}/{name}/v{version:06d}"


def dedupe_tied(state: dict) -> tuple[dict, dict[str, str]]:
    """Drop tensors that share memory with an earlier key (tied embeddings); safetensors
    refuses shared tensors. Returns (state without duplicates, {dropped_key: kept_key})."""
    seen: dict[tuple, str] = {}
    kept, aliases = {}, {}
    for key, tensor in state.items():
        ident = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and ident in seen:
            aliases[key] = seen[ident]
            continue
        seen[ident] = key
        kept[key] = tensor.detach().cpu().contiguous()
    return kept, aliases


def base_reference(base: str | None) -> str | None:
    """A LoRA adapter's ``base_model_name_or_path`` as it is recorded: a local folder as its
    absolute path (peft keeps the path the base was loaded by, relative to the working folder
    then), so the adapter loads from any working folder; anything else (a hub name) as is."""
    if base and not os.path.isabs(base) and os.path.isdir(base):
        return os.path.abspath(base)
    return base


def _payload_files(model, tokenizer) -> tuple[dict[str, bytes], str, dict[str, str]]:
    """The files of a checkpoint as bytes, its kind (full | lora) and its tied aliases."""
    from safetensors.torch import save as st_save

    files: dict[str, bytes] = {}
    if is_lora_model(model):
        kind, aliases = "lora", {}
        state = {k: v.detach().cpu().contiguous() for k, v in adapter_state(model).items()}
        files["adapter_model.safetensors"] = st_save(state)
        peft_config = model.peft_config[model.active_adapter].to_dict()
        peft_config["base_model_name_or_path"] = base_reference(
            peft_config.get("base_model_name_or_path"))
        files["adapter_config.json"] = json.dumps(peft_config, default=list, indent=2).encode()
    else:
        kind = "full"
        state, aliases = dedupe_tied(model.state_dict())
        files["model.safetensors"] = st_save(state)
        files["config.json"] = model.config.to_json_string().encode()
    if tokenizer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            for path in Path(tmp).iterdir():
                if path.is_file():
                    files[path.name] = path.read_bytes()
    return files, kind, aliases


def _exists_error(name: str, version: int, final: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {name} v{version} already exists at {final}; a "
                           "version is written once: save a new version (or discard_version "
                           "one that was never committed)")


def save_checkpoint(model, root_uri: str, name: str, version: int, tokenizer=None,
                    extra: dict | None = None) -> str:
    """Write ``model`` (full weights, or only the adapter of a peft LoRA model) as
    ``{root}/{name}/v{version:06d}`` atomically; return that directory's URI.

    ``extra`` (JSON-serialisable) goes into the manifest. An existing version (even a
    partial one) raises :class:`CheckpointError`: versions are never rewritten in place.
    """
    if version < 0:
        raise CheckpointError(f"version={version} must be >= 0")
    fs, root = _fs_and_path(root_uri)
    final = f"{root}/{name}/v{version:06d}"
    if fs.exists(final):
        raise _exists_error(name, version, final)
    files, kind, aliases = _payload_files(model, tokenizer)
    tmp = f"{root}/{name}/.tmp-v{version:06d}-{uuid.uuid4().hex[:8]}"
    try:
        fs.makedirs(tmp, exist_ok=True)
        entries = {}
        for filename, data in files.items():
            with fs.open(f"{tmp}/{filename}", "wb") as handle:
                handle.write(data)
            entries[filename] = {"sha256": hashlib.sha256(data).hexdigest(),
                                 "crc32": zlib.crc32(data), "size": len(data)}
        manifest = {"name": name, "version": version, "kind": kind, "files": entries,
                    "aliases": aliases, "created": time.time(), "extra": extra or {}}
        with fs.open(f"{tmp}/{MANIFEST}", "wb") as handle:
            handle.write(json.dumps(manifest, indent=2, sort_keys=True).encode())
    except BaseException as error:  # a full disk, above all: leave nothing to keep it full
        _remove_quietly(fs, tmp)
        full = disk_full(error, f"checkpoint {name} v{version}", root) \
            if isinstance(error, OSError) else None
        if full is not None:
            raise full from error
        raise
    _publish(fs, tmp, final, name, version)
    return version_uri(root_uri, name, version)


def payload_digests(model, tokenizer=None) -> dict[str, str]:
    """{filename: sha256} of the files :func:`save_checkpoint` would write for ``model`` now
    (the manifest's ``files`` entries, without writing anything)."""
    files, _, _ = _payload_files(model, tokenizer)
    return {filename: hashlib.sha256(data).hexdigest() for filename, data in files.items()}


def verified_manifest(uri: str) -> dict | None:
    """The manifest of one version directory when it is complete and every file it lists has
    its sha256 and size; None when the directory or its manifest is absent. A torn or
    corrupted file raises :class:`CheckpointError` (as loading would)."""
    fs, path = _fs_and_path(uri)
    if not fs.exists(f"{path}/{MANIFEST}"):
        return None
    manifest = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))
    for filename, entry in manifest["files"].items():
        try:
            data = fs.cat_file(f"{path}/{filename}")
        except FileNotFoundError as exc:
            raise CheckpointError(f"{uri}: {filename} listed in the manifest is missing") from exc
        if hashlib.sha256(data).hexdigest() != entry["sha256"] or len(data) != entry["size"]:
            raise CheckpointError(f"{uri}: {filename} differs from its manifest entry")
    return manifest


def version_exists(root_uri: str, name: str, version: int) -> bool:
    """Whether ``{root}/{name}/v{version:06d}`` exists (complete or not)."""
    fs, path = _fs_and_path(version_uri(root_uri, name, version))
    return fs.exists(path)


def _publish(fs, tmp: str, final: str, name: str, version: int) -> None:
    """Rename the finished temp folder to its version name, refusing an existing one."""
    if _is_local(fs):
        try:
            os.rename(tmp, final)  # atomic; fails (ENOTEMPTY/EEXIST) if final exists
        except OSError as error:
            fs.rm(tmp, recursive=True)
            raise _exists_error(name, version, final) from error
        return
    if fs.exists(final):
        fs.rm(tmp, recursive=True)
        raise _exists_error(name, version, final)
    fs.mv(tmp, final, recursive=True)


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def discard_version(root_uri: str, name: str, version: int) -> bool:
    """Remove one version that its owner never committed (False if there is none).

    The folder is first renamed to ``.trash-v{version}-{uuid}`` (atomic on local paths), then
    deleted; a kill in between leaves only a ``.trash-*`` folder for :func:`clean_leftovers`.
    Never call it on a version the store records: recorded versions are immutable.
    """
    fs, root = _fs_and_path(root_uri)
    final = f"{root}/{name}/v{version:06d}"
    if not fs.exists(final):
        return False
    trash = f"{root}/{name}/.trash-v{version:06d}-{uuid.uuid4().hex[:8]}"
    fs.mv(final, trash, recursive=True)
    fs.rm(trash, recursive=True)
    return True


def clean_leftovers(root_uri: str, name: str) -> list[str]:
    """Delete what killed writers left under ``{root}/{name}``: partial ``.tmp-*`` version
    folders, half-deleted ``.trash-*`` ones and temp optimizer files (``*.tmp-*``). Returns
    the removed names. Call it when the only writer of ``name`` (its trainer) starts."""
    fs, root = _fs_and_path(root_uri)
    base = f"{root}/{name}"
    if not fs.exists(base):
        return []
    removed = []
    for entry in fs.ls(base, detail=False):
        leaf = entry.rstrip("/").rsplit("/", 1)[-1]
        if leaf.startswith(".trash-") or ".tmp-" in leaf:  # .tmp-* folders, *.tmp-* files
            fs.rm(entry.rstrip("/"), recursive=True)
            removed.append(leaf)
    return sorted(removed)


def list_versions(root_uri: str, name: str) -> list[int]:
    """Complete versions (a manifest is present), ascending. Partial ``.tmp-*`` are ignored."""
    fs, root = _fs_and_path(root_uri)
    base = f"{root}/{name}"
    if not fs.exists(base):
        return []
    versions = []
    for entry in fs.ls(base, detail=False):
        match = _VERSION_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
        if match and fs.exists(f"{entry.rstrip('/')}/{MANIFEST}"):
            versions.append(int(match.group(1)))
    return sorted(versions)


def prune_versions(root_uri: str, name: str, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` complete versions; returns the versions removed.

    Versions are removed oldest first, so a crash mid-prune never removes a newer version
    than one it leaves behind.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest version must be kept (keep >= 1)")
    fs, _ = _fs_and_path(root_uri)
    removed = list_versions(root_uri, name)[:-keep]
    for version in removed:
        fs.rm(_fs_and_path(version_uri(root_uri, name, version))[1], recursive=True)
    return removed


def latest_version(root_uri: str, name: str) -> int | None:
    """The highest complete version of ``name``, or None when there is none."""
    versions = list_versions(root_uri, name)
    return versions[-1] if versions else None


def read_checkpoint_dir(uri: str) -> tuple[dict, dict]:
    """Verify and read one version directory: returns (state_dict, manifest).

    Raises :class:`CheckpointError` when the manifest is missing (an incomplete write) or a
    file's sha256 or size differs from the manifest (corruption).
    """
    from safetensors.torch import load as st_load

    fs, path = _fs_and_path(uri)
    if not fs.exists(f"{path}/{MANIFEST}"):
        raise CheckpointError(f"{uri} has no {MANIFEST}: the checkpoint is missing or was not "
                              "completely written; load another version")
    manifest = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))
    blobs = {}
    for filename, entry in manifest["files"].items():
        try:
            data = fs.cat_file(f"{path}/{filename}")
        except FileNotFoundError as exc:
            raise CheckpointError(f"{uri}: {filename} listed in the manifest is missing") from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"] or len(data) != entry["size"]:
            raise CheckpointError(
                f"{uri}: {filename} is corrupted (sha256 {digest[:12]}..., size {len(data)}; "
                f"manifest says {entry['sha256'][:12]}..., size {entry['size']}); "
                "do not use it, load another version")
        blobs[filename] = data
    weights = "adapter_model.safetensors" if manifest["kind"] == "lora" else "model.safetensors"
    state = st_load(blobs[weights])
    for dropped, kept in manifest.get("aliases", {}).items():
        state[dropped] = state[kept]
    return state, manifest


def load_checkpoint(root_uri: str, name: str, version: int | None = None, model=None):
    """Load version ``version`` (default: the latest complete one) of ``name``.

    Returns ``(state_dict, manifest)``, or ``(model, manifest)`` when ``model`` is given:
    the weights are then loaded into it (strictly for full weights; into the adapter of a peft
    model for LoRA checkpoints).
    """
    if version is None:
        version = latest_version(root_uri, name)
        if version is None:
            raise CheckpointError(f"no complete checkpoint of {name!r} under {root_uri}; "
                                  "train and save one first")
    state, manifest = read_checkpoint_dir(version_uri(root_uri, name, version))
    if model is None:
        return state, manifest
    if manifest["kind"] == "lora":
        load_adapter_state(model, state)
    else:
        model.load_state_dict(state, strict=True)
    return model, manifest
