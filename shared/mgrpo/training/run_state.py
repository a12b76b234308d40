"""A run's persistent state in embedded mode: its checkpoint and optimizer folders, the
state file (the commit point) and what a resume or a fresh start does with them.

Checkpoints go under ``out_dir/checkpoints/<name>/`` and optimizer state under
``out_dir/optim/<name>/`` (:func:`run_dirs`), so a run never writes another's versions, even
in a shared ``out_dir``. After each round the weights, optimizer moments and the state file
naming the run are written (:func:`save_state`), the state file last and atomically. A run
starts from each model's ``path``, or from another run's checkpoint when ``init_from`` names
it. At start, what a killed run left uncommitted (temp folders, versions after the state
file's) is removed; versions are written once, so a fresh run over existing versions of the
same name is refused (:func:`start_weights`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

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
from mgrpo.training.config import RunConfig
from mgrpo.training.system import System, out_path

STATE_FILE = "state.json"


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def run_dirs(cfg: RunConfig, run_id: str | None = None,
             out_dir: str | None = None) -> tuple[str, Path]:
    """(checkpoint root, optimizer folder) of run ``run_id`` (default: ``cfg.name``) in
    ``out_dir`` (default: ``cfg.out_dir``)."""
    run_id, out_dir = run_id or cfg.name, out_dir or cfg.out_dir
    root = run_root(str(Path(out_dir) / "checkpoints"), run_id)
    return root, Path(out_dir) / "optim" / run_id


def save_state(system: System, round_index: int) -> None:
    ckpt_root, optim_dir = run_dirs(system.cfg)
    optim_dir.mkdir(parents=True, exist_ok=True)
    for lm in system.models.values():
        if lm.optimizer is None:
            continue
        uri = save_checkpoint(lm.model, ckpt_root, lm.name, round_index + 1,
                              tokenizer=lm.tokenizer,
                              extra={"round": round_index, "run_id": system.cfg.name})
        # Versioned like the weights: the state file may still name the previous round.
        optim = optim_dir / f"{lm.name}-v{round_index + 1}.pt"
        torch.save(lm.optimizer.state_dict(), optim.with_suffix(".tmp"))
        os.replace(optim.with_suffix(".tmp"), optim)
        lm.version = round_index + 1
        sync_sampler(lm, uri)
    write_json_atomic(out_path(system.cfg, STATE_FILE),
                       {"completed_rounds": round_index + 1, "run_id": system.cfg.name})
    for lm in system.models.values():  # only the state file's version is needed now
        (optim_dir / f"{lm.name}-v{round_index}.pt").unlink(missing_ok=True)
        if lm.optimizer is not None:
            prune_versions(ckpt_root, lm.name, keep=system.cfg.keep_checkpoints)


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
    ckpt_root, optim_dir = run_dirs(cfg)
    removed = []
    for name in models:
        removed += [f"{name}/{leaf}" for leaf in clean_leftovers(ckpt_root, name)]
        for version in list_versions(ckpt_root, name):
            if done is not None and version > done \
                    and discard_version(ckpt_root, name, version):
                removed.append(f"{name}/v{version:06d}")
    if optim_dir.exists():
        for path in optim_dir.iterdir():
            stem = path.name.removesuffix(".pt").removesuffix(".tmp")
            version = stem.rsplit("-v", 1)[-1]
            if path.suffix == ".tmp" or (done is not None and version.isdigit()
                                         and int(version) > done):
                path.unlink()
                removed.append(f"optim/{path.name}")
    return removed


def start_weights(system: System, resume: bool) -> int:
    """Clean leftovers; then resume (``resume``), or start fresh (from ``init_from`` if the
    config names a run). Returns the rounds already done."""
    cfg = system.cfg
    trained = [lm.name for lm in system.models.values() if lm.optimizer is not None]
    clean_uncommitted(cfg, trained)
    if resume:
        return _restore_state(system)
    ckpt_root, _ = run_dirs(cfg)
    taken = [name for name in trained if list_versions(ckpt_root, name)]
    if taken:
        raise FileExistsError(
            f"run {cfg.name!r} already has checkpoints of {taken} in {cfg.out_dir}; versions "
            "are written once: resume it (--resume), or pick another name or out_dir")
    if cfg.init_from is not None:
        source_root, _ = run_dirs(cfg, cfg.init_from.run_id, cfg.init_from.out_dir)
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
    ckpt_root, optim_dir = run_dirs(system.cfg)
    for lm in system.models.values():
        if lm.optimizer is None:
            continue
        load_checkpoint(ckpt_root, lm.name, version=done, model=lm.model)
        lm.optimizer.load_state_dict(torch.load(optim_dir / f"{lm.name}-v{done}.pt"))
        lm.version = done
        sync_sampler(lm, version_uri(ckpt_root, lm.name, done))
    return done
