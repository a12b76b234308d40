"""The one checkpoint format of a trainer, at any world size: the single-process trainer's
Hugging Face folder (``mgrpo.models.checkpoint``: safetensors, tied weights saved once,
manifest with sha256) plus the optimizer state the manifest names and vouches for with a
digest. A job of N ranks writes that state with ``torch.distributed.checkpoint`` (DCP); one
process writes ``.optimizer.pt`` (:mod:`mgrpo.parallel.optimizer_state`). :func:`load_optimizer`
is the one loader: it reads either into a model on any number of ranks, one included.

- **Loading** (every rank, same files: the checkpoint store is shared): the full weights of
  the checkpoint or the initial folder (``set_model_state_dict`` with ``full_state_dict``:
  each rank keeps its shard), and the optimizer state the manifest names: a DCP folder,
  checked against its digest and loaded sharded (``dcp.load`` + ``set_optimizer_state_dict``:
  any number of ranks, 1 included), or the single-process ``.optimizer.pt``.
- **Saving** (collective): the optimizer state with DCP, each rank writing its shard into a
  temp folder that rank 0 renames to ``v{version:06d}.optim-dcp`` beside the version folder;
  then the full weights gathered (``get_model_state_dict``, ``full_state_dict`` +
  ``cpu_offload``) and written by rank 0 as the single-process trainer's folder. The manifest
  names the DCP folder with a sha256 over its files (:func:`tree_digest`), so a recorded
  checkpoint vouches for its optimizer shards as it does for the ``.optimizer.pt`` of a
  single process.

What this module does NOT do: decide when to load or save (the trainer service), talk to the
other ranks about it (:mod:`mgrpo.parallel.ranks` sends the commands), or shard a model
(:mod:`mgrpo.parallel.sharding`).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import fsspec
import torch

from mgrpo.models import checkpoint as folders
from mgrpo.models.loading import folder_weights
from mgrpo.parallel.optimizer_state import OptimizerStateError, load_optimizer_state
from mgrpo.parallel.sharding import is_sharded

DCP_SUFFIX = ".optim-dcp"


def dcp_uri(version_uri: str) -> str:
    """``.../v000003`` -> ``.../v000003.optim-dcp`` (a sibling, like ``.optimizer.pt``)."""
    return version_uri.rstrip("/") + DCP_SUFFIX


def tree_digest(uri: str) -> tuple[str, int]:
    """sha256 over a folder's files (sorted names, each name and content) and total size."""
    fs, path = fsspec.core.url_to_fs(uri)
    digest, size = hashlib.sha256(), 0
    for name in sorted(entry.rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)):
        data = fs.cat_file(f"{path}/{name}")
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        size += len(data)
    return digest.hexdigest(), size


def _storage(uri: str, write: bool):
    """DCP's writer/reader: the plain file system one for a local URI, else fsspec's."""
    fs, path = fsspec.core.url_to_fs(uri)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

        return FileSystemWriter(path) if write else FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    return FsspecWriter(uri) if write else FsspecReader(uri)


def load_weights(lm, checkpoint: tuple[str, int] | None, source: str,
                 tied: tuple[list[str], dict[str, str]]) -> None:
    """The checkpoint's (or the folder ``source``'s) full weights into a sharded model
    (``tied``: :func:`mgrpo.parallel.sharding.tied_aliases` of the plain model)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    where = checkpoint[0] if checkpoint is not None else folder_weights(source)
    state = folders.read_checkpoint_dir(where)[0] if isinstance(where, str) else where
    order, aliases = tied
    missing = set(aliases) - set(state)
    unknown = set(state) - set(order)
    if unknown:
        raise ValueError(f"weights do not fit the model: unexpected={sorted(unknown)[:5]}; "
                         "load a checkpoint of the same architecture")
    state = {**state, **{k: state[aliases[k]] for k in missing if aliases[k] in state}}
    state = {k: state[k] for k in order if k in state}  # the model's order on every rank:
    # the scatters below are collectives (a safetensors file's order differs per process)
    set_model_state_dict(lm.model, state, options=StateDictOptions(full_state_dict=True))
    lm.engine.version = checkpoint[1] if checkpoint is not None else 0


def optimizer_entry(version_uri: str) -> dict | None:
    """The manifest's ``extra.optimizer`` of a checkpoint (None: saved without one)."""
    with fsspec.open(f"{version_uri.rstrip('/')}/{folders.MANIFEST}", "rb") as handle:
        return json.loads(handle.read()).get("extra", {}).get("optimizer") or None


def load_dcp_optimizer(model, optimizer, version_uri: str, entry: dict) -> None:
    """Fill the fresh ``optimizer`` from the checkpoint's DCP folder, checked against the
    manifest's digest; every rank calls it (or one process without a group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        _init_optim_state,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    uri = dcp_uri(version_uri)
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        raise OptimizerStateError(f"{uri} is named by the manifest of {version_uri} but "
                                  "missing; restore it or delete the checkpoint's store record")
    digest, size = tree_digest(uri)
    if digest != entry["sha256"] or size != entry["size"]:
        raise OptimizerStateError(f"{uri} is corrupted (sha256 {digest[:12]}..., size {size}; "
                                  f"manifest says {entry['sha256'][:12]}..., size "
                                  f"{entry['size']}); do not resume from it")
    # DCP loads into the keys it is given, so Adam's must exist: a zero step creates them,
    # which torch skips while any parameter holds a gradient (the last update's)
    optimizer.zero_grad(set_to_none=True)
    _init_optim_state(optimizer)
    if not optimizer.state:
        raise OptimizerStateError(f"cannot restore {uri}: {type(optimizer).__name__} made no "
                                  "state to load into")
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, storage_reader=_storage(uri, write=False))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_full_optimizer(model, optimizer, version_uri: str) -> bool:
    """A single process's ``.optimizer.pt`` (ids = the order of the trainable parameters)
    into a sharded model's ``optimizer`` (a run that resumes with more ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    shadow = torch.optim.Adam([torch.nn.Parameter(torch.zeros(0)) for _ in names])
    if not load_optimizer_state(shadow, version_uri):  # sha256 checked there
        return False
    plain = shadow.state_dict()
    full = {"state": {names[i]: s for i, s in plain["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                             for g in plain["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full,
                             options=StateDictOptions(full_state_dict=True))
    return True


def load_optimizer(model, optimizer, version_uri: str) -> bool:
    """Whatever optimizer state the checkpoint's manifest names (DCP folder or ``.pt``)."""
    entry = optimizer_entry(version_uri)
    if entry is None:
        return False
    if entry.get("format") == "dcp":
        load_dcp_optimizer(model, optimizer, version_uri, entry)
        return True
    if is_sharded(model):
        return load_full_optimizer(model, optimizer, version_uri)
    return load_optimizer_state(optimizer, version_uri)


class _Gathered:
    """What ``save_checkpoint`` reads of a model: its full state dict and config."""

    def __init__(self, state: dict, config) -> None:
        self._state, self.config = state, config

    def state_dict(self) -> dict:
        return self._state


def save(lm, root: str, version: int, tmp_name: str, extra: dict | None,
         tied: tuple[list[str], dict[str, str]]) -> str | None:
    """Collective: the optimizer shards (DCP), then the full weights to rank 0, which
    writes the Hugging Face folder (``extra`` + the DCP entry in its manifest). Returns
    the version's URI on rank 0, None elsewhere. ``tmp_name``: the same on every rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    final = folders.version_uri(root, lm.name, version)
    fs, final_path = fsspec.core.url_to_fs(final)
    if fs.exists(final_path):  # every rank sees it (shared store): all raise, no collective
        raise OptimizerStateError(f"{final} exists already: its optimizer state is never "
                                  "rewritten; save a new version")
    tmp = f"{root.rstrip('/')}/{lm.name}/{tmp_name}"
    dcp.save({"optimizer": get_optimizer_state_dict(lm.model, lm.optimizer)},
             storage_writer=_storage(tmp, write=True))
    sharded = is_sharded(lm.model)
    state = get_model_state_dict(lm.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True)) if sharded else None
    if dist.get_rank() != 0:
        return None
    target = dcp_uri(final)
    _, target_path = fsspec.core.url_to_fs(target)
    _, tmp_path = fsspec.core.url_to_fs(tmp)
    if fs.exists(target_path):  # a killed writer's, never recorded (the version is absent)
        fs.rm(target_path, recursive=True)
    fs.mv(tmp_path, target_path, recursive=True)
    digest, size = tree_digest(target)
    entry = {"file": target.rsplit("/", 1)[-1], "format": "dcp", "sha256": digest,
             "size": size, "ranks": dist.get_world_size()}
    model = lm.model
    if sharded:
        order, aliases = tied
        state = {k: state[k] for k in order if k in state}
        state.update({k: state[v] for k, v in aliases.items() if v in state})
        model = _Gathered(state, lm.model.config)
    return folders.save_checkpoint(model, root, lm.name, version, tokenizer=lm.tokenizer,
                                   extra={**(extra or {}), "optimizer": entry})


def temp_name(version: int) -> str:
    """A DCP temp folder's name (``clean_leftovers`` removes ``.tmp-*`` of killed writers)."""
    return f".tmp-v{version:06d}{DCP_SUFFIX}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
