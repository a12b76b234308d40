"""A run's persistent state in embedded mode: its checkpoints with their optimizer state, the
state file (the commit point) and what a resume or a fresh start does with them.

Checkpoints go under ``out_dir/checkpoints/<name>/`` (:func:`checkpoint_root`), so a run never
writes another's versions, even in a shared ``out_dir``. Each version's optimizer state
(Adam moments, step counts, the KL coefficient) is the trainer service's format,
:mod:`mgrpo.parallel.optimizer_state`: ``v<version>.optimizer.pt`` beside the version folder,
its sha256 and size in the version's manifest, checked on load (a mismatch is refused in one
line). After each round the optimizer state, the weights and the state file naming the run
are written (:func:`save_state`), the state file last and atomically (:mod:`mgrpo.atomic`);
``keep_checkpoints`` prunes a version's folder and optimizer file together. A run starts from
each model's ``path``, or from another run's checkpoint when ``init_from`` names it. At
start, what a killed run left uncommitted (temp folders and files, versions and optimizer
files after the state file's) is removed; versions are written once, so a fresh run over
existing versions of the same name is refused (:func:`start_weights`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from mgrpo.atomic import write_text_atomic
from mgrpo.models.checkpoint import (
    clean_leftovers,
    discard_version,
    latest_version,
    list_versions,
    load_checkpoint,
    prune_versions,
    run_root,
    save_checkpoint,
    version_uri,
)
from mgrpo.models.lora import is_lora_model
from mgrpo.parallel.optimizer_state import (
    SUFFIX,
    OptimizerStateError,
    discard_optimizer_state,
    load_optimizer_state,
    save_optimizer_state,
)
from mgrpo.training.config import RunConfig
from mgrpo.training.system import System, out_path

STATE_FILE = "state.json"
_OPTIMIZER_FILE = re.compile(r"^v(\d{6})" + re.escape(SUFFIX) + "$")


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True))


def checkpoint_root(cfg: RunConfig, run_id: str | None = None,
                    out_dir: str | None = None) -> str:
    """The checkpoint root of run ``run_id`` (default: ``cfg.name``) in ``out_dir`` (default:
    ``cfg.out_dir``): its versions and their optimizer files."""
    run_id, out_dir = run_id or cfg.name, out_dir or cfg.out_dir
    return run_root(str(Path(out_dir) / "checkpoints"), run_id)


def save_state(system: System, round_index: int) -> None:
    """Write round ``round_index``'s version of every trained model (optimizer state, then
    the weights whose manifest vouches for it), then the state file; then prune."""
    ckpt_root, version = checkpoint_root(system.cfg), round_index + 1
    for lm in system.models.values():
        if lm.optimizer is None:
            continue
        uri = version_uri(ckpt_root, lm.name, version)
        extra = {"round": round_index, "run_id": system.cfg.name,
                 "optimizer": save_optimizer_state(lm.optimizer, uri)}
        try:
            uri = save_checkpoint(lm.model, ckpt_root, lm.name, version,
                                  tokenizer=lm.tokenizer, extra=extra)
        except BaseException:
            discard_optimizer_state(uri)
            raise
        lm.version = version
        sync_sampler(lm, uri)
    write_json_atomic(out_path(system.cfg, STATE_FILE),
                      {"completed_rounds": version, "run_id": system.cfg.name})
    for lm in system.models.values():
        if lm.optimizer is not None:
            for old in prune_versions(ckpt_root, lm.name, keep=system.cfg.keep_checkpoints):
                discard_optimizer_state(version_uri(ckpt_root, lm.name, old))


def sync_sampler(lm, uri: str) -> None:
    """Give ``lm``'s engine version ``lm.version`` (checkpoint ``uri``): an engine over the
    trained model itself (TorchEngine) only takes the number; a separate torch module in this
    process (a TorchEngine over a copy) takes the trainer's tensors, copied in place (no disk
    read); any other sampler (e.g. a VLLMEngine put in ``lm.engine``) loads the checkpoint:
    a LoRA model's holds only the adapter, so only the adapter is pushed."""
    sampler_model = getattr(lm.engine, "model", None)
    if sampler_model is lm.model:
        lm.engine.version = lm.version
    elif isinstance(sampler_model, torch.nn.Module) and not is_lora_model(lm.model):
        lm.engine.load_weights(lm.model.state_dict(), lm.version)
    else:
        lm.engine.load_weights(uri, lm.version)


def _committed_rounds(cfg: RunConfig) -> int | None:
    """Rounds the state file commits for THIS run: 0 without a state file, None when it is
    another run's (the out_dir's last run; this run's commit point is then unknown)."""
    state_path = Path(cfg.out_dir) / STATE_FILE
    if not state_path.exists():
        return 0
    state = json.loads(state_path.read_text())
    return state["completed_rounds"] if state.get("run_id", cfg.name) == cfg.name else None


def clean_uncommitted(cfg: RunConfig, models: list[str]) -> list[str]:
    """Remove what a killed run left behind: temp folders and files, and (when the state
    file is this run's) versions and optimizer files after the state file's. Returns what
    was removed."""
    done = _committed_rounds(cfg)
    ckpt_root = checkpoint_root(cfg)
    removed = []
    for name in models:
        removed += [f"{name}/{leaf}" for leaf in clean_leftovers(ckpt_root, name)]
        if done is None:
            continue
        for version in list_versions(ckpt_root, name):
            if version > done and discard_version(ckpt_root, name, version):
                removed.append(f"{name}/v{version:06d}")
        folder = Path(ckpt_root) / name
        for path in sorted(folder.iterdir()) if folder.is_dir() else ():
            match = _OPTIMIZER_FILE.match(path.name)
            if match and int(match.group(1)) > done:
                path.unlink()
                removed.append(f"{name}/{path.name}")
    return removed


def start_weights(system: System, resume: bool) -> int:
    """Clean leftovers; then resume (``resume``), or start fresh (from ``init_from`` if the
    config names a run). Returns the rounds already done."""
    cfg = system.cfg
    trained = [lm.name for lm in system.models.values() if lm.optimizer is not None]
    clean_uncommitted(cfg, trained)
    if resume:
        return _restore_state(system)
    ckpt_root = checkpoint_root(cfg)
    taken = [name for name in trained if list_versions(ckpt_root, name)]
    if taken:
        raise FileExistsError(
            f"run {cfg.name!r} already has checkpoints of {taken} in {cfg.out_dir}; versions "
            "are written once: resume it (--resume), or pick another name or out_dir")
    if cfg.init_from is not None:
        source_root = checkpoint_root(cfg, cfg.init_from.run_id, cfg.init_from.out_dir)
        for lm in system.models.values():
            version = cfg.init_from.version or latest_version(source_root, lm.name)
            if version is None:
                if lm.optimizer is not None:
                    raise FileNotFoundError(
                        f"init_from: run {cfg.init_from.run_id!r} has no checkpoint of "
                        f"{lm.name} under {source_root}")
                continue
            load_checkpoint(source_root, lm.name, version=version, model=lm.model)
            sync_sampler(lm, version_uri(source_root, lm.name, version))
    return 0


def _restore_state(system: System) -> int:
    """Load the last complete round's weights and optimizer state; returns rounds done."""
    done = _committed_rounds(system.cfg)
    if done is None:
        raise FileExistsError(
            f"{system.cfg.out_dir}/{STATE_FILE} belongs to another run; run "
            f"{system.cfg.name!r} can be resumed only while it is the out_dir's last run")
    if done == 0:
        return 0
    ckpt_root = checkpoint_root(system.cfg)
    for lm in system.models.values():
        if lm.optimizer is None:
            continue
        uri = version_uri(ckpt_root, lm.name, done)
        load_checkpoint(ckpt_root, lm.name, version=done, model=lm.model)
        if not load_optimizer_state(lm.optimizer, uri):  # sha256 and size checked there
            raise OptimizerStateError(
                f"{uri} names no optimizer state; run {system.cfg.name!r} cannot resume "
                "with its Adam moments: start a new run from it (init_from)")
        lm.version = done
        sync_sampler(lm, uri)
    return done
