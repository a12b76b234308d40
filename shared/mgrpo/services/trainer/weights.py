"""The weights of a trainer's run (part of :class:`mgrpo.services.trainer.service.TrainerService`):
which checkpoint is in the model, switching runs, writing a new version.

- :class:`TrainedModel`: the model, tokenizer, engine and optimizer one trainer trains.
- :func:`put_state`: a fresh Adam and the weights (plus optimizer state, when saved) of a
  recorded checkpoint or of a folder; every rank of a torchrun trainer runs it.
- :class:`RunWeights` (``TrainerService.weights``): :meth:`~RunWeights.activate` puts a
  run's newest recorded checkpoint in the model (removing the leftovers of killed writes the
  first time), :meth:`~RunWeights.save_checkpoint` writes optimizer state, then weights
  (atomic, write-once), then the store record.

What this module does NOT do: decide when to train or publish (``round_training``), serialize
files (``mgrpo.models.checkpoint``, ``mgrpo.parallel``), or run the other ranks of a
torchrun job (``mgrpo.parallel.ranks``).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from mgrpo.bus.app import control_app, send_control
from mgrpo.bus.control import TASK_PRUNE_CHECKPOINTS, PruneCheckpoints
from mgrpo.config import Settings
from mgrpo.models.checkpoint import (
    MANIFEST,
    CheckpointDiskFull,
    CheckpointError,
    clean_leftovers,
    discard_version,
    list_versions,
    payload_digests,
    run_root,
    save_checkpoint,
    verified_manifest,
    version_exists,
    version_uri,
)
from mgrpo.parallel.checkpoint import load_optimizer  # a .optimizer.pt or DCP folder
from mgrpo.parallel.optimizer_state import (
    discard_optimizer_state,
    optimizer_file_digest,
    optimizer_state_digest,
    save_optimizer_state,
)
from mgrpo.services.checkpoints import prune_checkpoints
from mgrpo.services.context import folder_weights, initial_weights, stored_run_config
from mgrpo.training.config import RunConfig
from mgrpo.training.precision import fresh_optimizer
from mgrpo.training.system import LoadedModel

# the trainer's lines keep one logger name
log = logging.getLogger("mgrpo.services.trainer.service")


@dataclass
class TrainedModel(LoadedModel):
    """Embedded mode's :class:`~mgrpo.training.system.LoadedModel` (what :func:`train_model`
    expects) plus the trainer's torchrun job."""

    ranks: object | None = None  # torchrun job (mgrpo.parallel.ranks.Ranks) or None


def put_state(lm: TrainedModel, lr: float, checkpoint: tuple[str, int] | None,
              source: str) -> bool:
    """A fresh Adam (``lr``) and the weights of the recorded ``checkpoint`` (uri, version)
    with its optimizer state, or, without one, of the folder ``source``. Returns whether Adam
    moments were restored. Every rank of a torchrun trainer runs it (``mgrpo.parallel.ranks``)."""
    if lm.optimizer is not None:  # the same kind (Adam/AdamW, weight decay), no moments
        lm.optimizer = fresh_optimizer(lm.optimizer, lm.model, lr)
    if checkpoint is None:
        lm.engine.load_weights(folder_weights(source), 0)
        return False
    lm.engine.load_weights(*checkpoint)
    return lm.optimizer is not None and load_optimizer(lm.model, lm.optimizer, checkpoint[0])


class RunWeights:
    """Which run's weights are in ``lm``, and the checkpoints it writes. ``cfg``: the
    deployment's run config (a model's ``lr`` when a run's stored config lacks the model).
    Keeps ``weights_of`` ((run, source) in ``lm``, None when unknown), ``cleaned`` (runs
    whose leftovers were removed) and ``checkpoint_problem`` (the last checkpoint write's,
    if it failed)."""

    def __init__(self, settings: Settings, cfg: RunConfig, store, lm: TrainedModel) -> None:
        self.settings, self.cfg, self.store, self.lm = settings, cfg, store, lm
        self.weights_of: tuple[str, str] | None = None
        self.cleaned: set[str] = set()
        self.checkpoint_problem: str | None = None
        self.control_celery = None  # the control plane's Celery app, made at the first prune sent

    def forget(self) -> None:
        """The weights in ``lm`` are unknown (a failed or interrupted update, another trainer
        writing meanwhile): the next :meth:`activate` loads them from the store."""
        self.weights_of = None

    def run_root(self, run_id: str) -> str:
        return run_root(self.settings.checkpoint_uri, run_id)

    def activate(self, run_id: str, cfg: RunConfig | None = None) -> None:
        """Put ``run_id``'s newest recorded checkpoint (weights + optimizer state) in the
        model, or, before the run has one, its initial weights with a fresh optimizer. A
        no-op when they are in already. The first time, removes the leftovers of killed
        writes of this model in this run."""
        lm, store = self.lm, self.store
        record = store.latest_checkpoint(lm.name, run_id=run_id)
        if run_id not in self.cleaned:
            root = self.run_root(run_id)
            removed = clean_leftovers(root, lm.name)
            recorded = {c.version for c in store.list_checkpoints(lm.name, run_id=run_id)}
            for version in list_versions(root, lm.name):
                if version not in recorded:  # written, never committed: a killed trainer's
                    discard_version(root, lm.name, version)
                    removed.append(f"v{version:06d}")
            if removed:
                log.info("trainer %s: removed leftovers of killed writes in run %s: %s",
                         lm.name, run_id, removed)
            self.cleaned.add(run_id)
        if cfg is None:
            cfg = stored_run_config(store, run_id)
        source = record.uri if record is not None else initial_weights(store, lm.name, cfg)
        if self.weights_of == (run_id, source):
            return
        own = cfg.models.get(lm.name) if cfg is not None else None  # this run's, else ours
        lr = (own or self.cfg.models[lm.name]).lr
        checkpoint = (record.uri, record.version) if record is not None else None
        load = put_state if lm.ranks is None else lm.ranks.load  # torchrun: on every rank
        moments = load(lm, lr, checkpoint, source)
        if record is not None:
            log.info("trainer %s: run %s resumes from v%d (%s)", lm.name, run_id,
                     record.version, "with its optimizer state" if moments else
                     "fresh optimizer state")
        else:
            log.info("trainer %s: run %s starts from %s", lm.name, run_id, source)
        lm.version = lm.engine.version
        self.weights_of = (run_id, source)

    def save_checkpoint(self, version: int, round_id: str | None, run_id: str,
                        keep: int | None = None) -> str:
        """Optimizer state, then the weights (atomic, write-once; the manifest names the
        optimizer file and its sha256, and the parent the update started from), then the
        store record: a checkpoint is recorded only when complete. Returns its URI.

        Idempotent on retry: a version folder that an earlier try wrote completely but could
        not record (the store went down in between) is recorded as it is when it holds
        exactly what this try would write (:meth:`reuse_unrecorded`). A failed write leaves
        no file behind; a full disk is remembered in ``checkpoint_problem`` (the trainer's
        ``/readyz``) until a write succeeds. ``keep``: then :meth:`prune` older versions."""
        lm, root = self.lm, self.run_root(run_id)
        extra: dict = {"round_id": round_id, "run_id": run_id,
                       "parent": self.weights_of[1] if self.weights_of else None}
        uri = self.reuse_unrecorded(root, version, run_id, extra)
        try:
            if uri is None:
                uri = self._write_version(root, version, extra)
        except CheckpointDiskFull as error:
            self.checkpoint_problem = f"checkpoint disk: {error}"
            raise
        self.checkpoint_problem = None
        self.store.record_checkpoint(lm.name, version, uri, _sha256(f"{uri}/{MANIFEST}"),
                                     round_id=round_id, run_id=run_id)
        lm.engine.version = lm.version = version
        self.weights_of = (run_id, uri)
        if keep is not None:
            self.prune(run_id, keep)
        return uri

    def recheck_disk(self) -> bool:
        """Clear ``checkpoint_problem`` once a local checkpoint disk has room for a version
        again: free space at least the model's weights plus, when it trains, Adam's two
        moments (:func:`checkpoint_bytes`). A remote ``MGRPO_CHECKPOINT_URI`` cannot be
        measured: its next write tells. True when the problem was cleared."""
        if self.checkpoint_problem is None:
            return False
        free = local_free_bytes(self.settings.checkpoint_uri)
        need = checkpoint_bytes(self.lm)
        if free is None or free < need:
            return False
        log.info("trainer %s: the checkpoint disk has room again (%d bytes free, a version "
                 "needs about %d)", self.lm.name, free, need)
        self.checkpoint_problem = None
        return True

    def _write_version(self, root: str, version: int, extra: dict) -> str:
        """Optimizer state, then the weights; a failed weights write removes the optimizer
        file it followed (nothing of a failed version stays on disk)."""
        lm = self.lm
        if lm.ranks is not None:  # torchrun: optimizer shards by DCP, gathered weights
            return lm.ranks.save(lm, root, version, extra)
        uri = version_uri(root, lm.name, version)
        if lm.optimizer is not None:
            extra["optimizer"] = save_optimizer_state(lm.optimizer, uri)
        try:
            return save_checkpoint(lm.model, root, lm.name, version, tokenizer=lm.tokenizer,
                                   extra=extra)
        except Exception:
            if lm.optimizer is not None:
                discard_optimizer_state(uri)
            raise

    def prune(self, run_id: str, keep: int) -> list[int]:
        """Delete this model's recorded versions of ``run_id`` older than the newest ``keep``
        (``keep_checkpoints``; :func:`mgrpo.services.checkpoints.prune_checkpoints`: the store
        records first, then the folders and optimizer files). With ``MGRPO_CONTROL_PRUNE`` the
        control worker does it (the task is sent; a send that fails prunes here). A failure
        is logged, never raised: the round is trained. Returns the versions removed here."""
        if keep < 1:
            return []
        if self.settings.control_prune:
            try:
                if self.control_celery is None:
                    self.control_celery = control_app(self.settings)
                send_control(self.control_celery, TASK_PRUNE_CHECKPOINTS, PruneCheckpoints(
                    run_id=run_id, model=self.lm.name, keep=keep))
                return []
            except Exception as error:  # noqa: BLE001 - the broker is down: prune here
                log.warning("trainer %s: cannot send the prune of run %s to the control "
                            "worker (%s); pruning here", self.lm.name, run_id, error)
        try:
            return prune_checkpoints(self.store, self.settings.checkpoint_uri, run_id,
                                     self.lm.name, keep)
        except Exception:  # noqa: BLE001 - the disk fills up later; health will say so
            log.exception("trainer %s: could not delete old checkpoints of run %s",
                          self.lm.name, run_id)
            return []

    def reuse_unrecorded(self, root: str, version: int, run_id: str,
                         extra: dict) -> str | None:
        """The URI of ``version`` when its folder exists, is complete, is not recorded, and
        holds the same weights, optimizer state and manifest ``extra`` as this try would
        write; None otherwise, after discarding such an unrecorded folder that differs (no
        reader loads a version the store does not record). A recorded version is left alone:
        the write-once guard refuses it."""
        lm = self.lm
        if not version_exists(root, lm.name, version) or \
                self.store.get_checkpoint(lm.name, version, run_id=run_id) is not None:
            return None
        uri = version_uri(root, lm.name, version)
        try:
            manifest = verified_manifest(uri)
        except CheckpointError:
            manifest = None  # torn: discarded below
        if manifest is not None and lm.ranks is None and _same_content(lm, manifest, extra,
                                                                       uri):
            log.info("trainer %s: v%d of run %s was written before its store record failed; "
                     "recording it", lm.name, version, run_id)
            return uri
        discard_version(root, lm.name, version)
        discard_optimizer_state(uri)
        log.warning("trainer %s: discarded the unrecorded v%d of run %s (%s); writing it "
                    "again", lm.name, version, run_id,
                    "incomplete" if manifest is None else "other content")
        return None


def _same_content(lm: TrainedModel, manifest: dict, extra: dict, uri: str) -> bool:
    """Whether the written version holds ``lm``'s weights and optimizer state and ``extra``."""
    written = dict(manifest.get("extra", {}))
    entry = written.pop("optimizer", None)
    if written != extra or {name: file["sha256"] for name, file in manifest["files"].items()} \
            != payload_digests(lm.model, lm.tokenizer):
        return False
    if lm.optimizer is None:
        return entry is None
    digest = optimizer_state_digest(lm.optimizer)
    return entry is not None and entry["sha256"] == digest == optimizer_file_digest(uri)


def checkpoint_bytes(lm: TrainedModel) -> int:
    """About what one version of ``lm`` takes on disk: its weights, and Adam's two moments
    (float32) when it trains."""
    params = list(lm.model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    moments = 2 * 4 * sum(p.numel() for p in params if p.requires_grad)
    return weights + (moments if lm.optimizer is not None else 0)


def local_free_bytes(uri: str) -> int | None:
    """Free bytes of the local file system ``uri`` (a path or ``file://``) is on, at its
    nearest existing folder; None for a remote URI (``s3://``, ...)."""
    if "://" in uri and not uri.startswith("file://"):
        return None
    path = Path(uri.removeprefix("file://")).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _sha256(uri: str) -> str:
    import fsspec

    with fsspec.open(uri, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()
