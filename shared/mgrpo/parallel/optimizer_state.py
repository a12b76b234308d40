"""A trainer's optimizer state (Adam moments and step counts) kept next to each checkpoint, so
a restarted trainer continues exactly where the killed one stopped. The one format of a single
process's optimizer state: the trainer service's (``services.trainer.weights``) and the
embedded loop's (``training.run_state``).

Layout: the version directory ``{root}/{model}/v{version:06d}/`` (``mgrpo.models.checkpoint``)
gets a sibling file ``{root}/{model}/v{version:06d}.optimizer.pt`` (``torch.save`` of
``optimizer.state_dict()``), written to a temporary name and renamed into place. Its sha256
and size go into the checkpoint's manifest (``extra["optimizer"]``), which is written after
it, and the store records the checkpoint last; so a recorded checkpoint always vouches for
its optimizer file, and a torn or swapped file is refused on load.

Write once, like the weights: the file of a version whose directory exists is never
rewritten (:class:`OptimizerStateError`), so a recorded checkpoint's moments cannot be swapped
under its manifest. Before the version exists the file may be replaced (a retry after a kill),
by an atomic rename. Temp files of killed writers (``*.optimizer.pt.tmp-*``) are removed by
:func:`mgrpo.models.checkpoint.clean_leftovers`.

What this module does NOT do: save weights (``mgrpo.models.checkpoint``), the sharded state of
a trainer of several ranks (a DCP folder: ``mgrpo.parallel.checkpoint``), garbage-collect
old files, or guess: a manifest that names an optimizer file which is missing or corrupted raises
:class:`OptimizerStateError` instead of silently restarting Adam.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid

import fsspec
import torch

from mgrpo.models.checkpoint import MANIFEST, disk_full

SUFFIX = ".optimizer.pt"


class OptimizerStateError(RuntimeError):
    """The optimizer state a checkpoint names is missing or does not match its manifest."""


def optimizer_state_uri(version_uri: str) -> str:
    """``.../v000003`` -> ``.../v000003.optimizer.pt`` (a sibling: the version directory is
    written atomically as a whole and must stay a Hugging Face folder)."""
    return version_uri.rstrip("/") + SUFFIX


def save_optimizer_state(optimizer: torch.optim.Optimizer, version_uri: str) -> dict:
    """Write ``optimizer.state_dict()`` next to ``version_uri`` (temp file, then rename).

    Returns ``{"file", "sha256", "size"}`` for the checkpoint manifest's ``extra``. Call it
    BEFORE ``save_checkpoint`` of the same version so the manifest can vouch for the file.
    Raises :class:`OptimizerStateError` if that version directory exists already.
    """
    fs, version_path = fsspec.core.url_to_fs(version_uri.rstrip("/"))
    if fs.exists(version_path):
        raise OptimizerStateError(
            f"{version_uri} exists already: its optimizer state is never rewritten; save a "
            "new version")
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    data = buffer.getvalue()
    target = optimizer_state_uri(version_uri)
    fs, path = fsspec.core.url_to_fs(target)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open(tmp, "wb") as handle:
            handle.write(data)
        fs.mv(tmp, path)
    except BaseException as error:  # a full disk, above all: leave no temp file to keep it full
        if fs.exists(tmp):
            fs.rm(tmp)
        full = disk_full(error, f"optimizer state {target.rsplit('/', 1)[-1]}",
                         path.rsplit("/", 1)[0]) if isinstance(error, OSError) else None
        if full is not None:
            raise full from error
        raise
    return {"file": target.rsplit("/", 1)[-1], "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data)}


def optimizer_state_digest(optimizer: torch.optim.Optimizer) -> str:
    """sha256 of the bytes :func:`save_optimizer_state` would write for ``optimizer`` now."""
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def optimizer_file_digest(version_uri: str) -> str | None:
    """sha256 of the optimizer file next to ``version_uri``; None when there is none."""
    try:
        with fsspec.open(optimizer_state_uri(version_uri), "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def discard_optimizer_state(version_uri: str) -> None:
    """Remove the optimizer file of a version its owner never committed (if any)."""
    fs, path = fsspec.core.url_to_fs(optimizer_state_uri(version_uri))
    if fs.exists(path):
        fs.rm(path)


def load_optimizer_state(optimizer: torch.optim.Optimizer, version_uri: str) -> bool:
    """Load the optimizer state a checkpoint's manifest names into ``optimizer``.

    Returns False (``optimizer`` untouched) when the manifest names none: a checkpoint
    written without one (e.g. the warm start). Raises :class:`OptimizerStateError` when the
    named file is missing or its sha256/size differ from the manifest.
    """
    with fsspec.open(f"{version_uri.rstrip('/')}/{MANIFEST}", "rb") as handle:
        entry = json.loads(handle.read()).get("extra", {}).get("optimizer")
    if not entry:
        return False
    target = optimizer_state_uri(version_uri)
    try:
        with fsspec.open(target, "rb") as handle:
            data = handle.read()
    except FileNotFoundError as error:
        raise OptimizerStateError(
            f"{target} is named by the manifest of {version_uri} but missing; restore it or "
            "delete the checkpoint's store record to restart from the previous version"
        ) from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"] or len(data) != entry["size"]:
        raise OptimizerStateError(
            f"{target} is corrupted (sha256 {digest[:12]}..., size {len(data)}; manifest says "
            f"{entry['sha256'][:12]}..., size {entry['size']}); do not resume from it")
    optimizer.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))
    return True
