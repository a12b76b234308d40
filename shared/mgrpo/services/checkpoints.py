"""Delete a run's old checkpoints of one model, keeping the newest ``keep`` recorded ones
(``keep_checkpoints``), the same way wherever it runs (the trainer after a save, the control
task ``mgrpo.control.prune_checkpoints``).

Order: the store records first (no reader loads a version the store does not record), then
the version folders, their optimizer files and DCP folders. Folders of versions older than
the oldest kept one that the store no longer records (a kill between the two steps) are
removed too, so running it again finishes what a killed run started: it is idempotent.
Versions newer than the oldest kept one are never touched (a version being written is
newer than every recorded one).

What this module does NOT do: decide when to prune, or remove ``.tmp-*``/``.trash-*``
leftovers of killed writes (``mgrpo.models.checkpoint.clean_leftovers``, at trainer start).
"""

from __future__ import annotations

import logging

import fsspec

from mgrpo.models.checkpoint import discard_version, list_versions, run_root, version_uri
from mgrpo.parallel.checkpoint import dcp_uri
from mgrpo.parallel.optimizer_state import discard_optimizer_state

log = logging.getLogger(__name__)


def prune_checkpoints(store, checkpoint_uri: str, run_id: str, model: str,
                      keep: int) -> list[int]:
    """Delete ``model``'s versions of ``run_id`` older than its newest ``keep`` recorded ones
    (records, then files); returns the versions whose records or folders were deleted."""
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest version must be kept (keep >= 1)")
    recorded = sorted(c.version for c in store.list_checkpoints(model, run_id=run_id))
    if not recorded:
        return []
    old, oldest_kept = recorded[:-keep], recorded[-keep:][0]
    if old:
        store.forget_checkpoints(model, old, run_id=run_id)
    root = run_root(checkpoint_uri, run_id)
    unrecorded = [v for v in list_versions(root, model) if v < oldest_kept and v not in old]
    for version in sorted({*old, *unrecorded}):
        uri = version_uri(root, model, version)
        discard_version(root, model, version)
        discard_optimizer_state(uri)
        _remove_tree(dcp_uri(uri))
    removed = sorted({*old, *unrecorded})
    if removed:
        log.info("%s: deleted v%s of run %s (keep %d)", model, ", v".join(map(str, removed)),
                 run_id, keep)
    return removed


def _remove_tree(uri: str) -> None:
    fs, path = fsspec.core.url_to_fs(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)
