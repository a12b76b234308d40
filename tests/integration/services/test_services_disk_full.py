"""A full checkpoint disk (a 1 MiB tmpfs; one round of the three tiny models needs ~1.3 MB):
the round fails with a reason that says so, no ``*.tmp-*`` file or folder is left behind to
keep the disk full, and the trainer that could not write says why on its ``/readyz``
(``TrainerService.not_ready``) and on its lease row, where the planner API reads it: its
``POST /v1/rounds`` check names that trainer until the disk has room again. Before, ENOSPC
failed the round as a bare ``OSError``, left three ``*.optimizer.pt.tmp-*`` files, health
stayed green, and the API accepted new rounds that failed the same way.

The services run in this process on the in-memory bus, with the real PostgreSQL; the tmpfs
needs root (``mount``), else the test skips."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    write_run_config,
)

from mgrpo.services.api.routes.health import missing_round_workers
from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round
from mgrpo.store.admin import temporary_database


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, unmounted afterwards."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_full_checkpoint_disk_fails_the_round_cleanly_and_says_so(postgres_url, tmp_path,
                                                                  small_disk):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), name="full", k=2, queries=3)
    with temporary_database(postgres_url) as url:
        settings = embedded_settings(tmp_path, cfg_path, database_url=url,
                                     checkpoint_uri=str(small_disk))
        with in_process_services(settings) as svc:
            record = start_round(svc.store, svc.bus, svc.cfg, Queues(settings.queue_prefix))
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and \
                    svc.store.get_round(record.round_id).status not in ("done", "failed"):
                time.sleep(0.2)
            final = svc.store.get_round(record.round_id)
            assert final.status == "failed", final.status
            assert "CheckpointDiskFull" in final.error and "no space left" in final.error, \
                final.error
            leftovers = [str(p) for p in Path(small_disk).rglob("*") if ".tmp-" in p.name]
            assert leftovers == [], leftovers
            unready = {m: t.not_ready() for m, t in svc.trainers.items()}
            assert any(any(p.startswith("checkpoint disk: no space left") for p in problems)
                       for problems in unready.values()), unready
            full = [m for m, problems in unready.items() if problems]
            for model in full:  # the model that could not write has no version on disk
                assert not (Path(small_disk) / "full" / model / "v000001").exists()
                assert not list((Path(small_disk) / "full" / model).glob("*.optimizer.pt"))
            # the planner API sees it on the trainer's lease row: POST /v1/rounds would 409
            api = SimpleNamespace(store=svc.store)
            assert wait_until(lambda: len(missing_round_workers(api, svc.cfg)) == len(full))
            for model, phrase in zip(sorted(full), sorted(missing_round_workers(api, svc.cfg)),
                                     strict=True):
                assert phrase.startswith(f"trainer of {model} cannot finish a round: "
                                         "checkpoint disk: no space left"), phrase
            # room again (the tmpfs grows): the trainers say so without a round written
            subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
            assert wait_until(lambda: missing_round_workers(api, svc.cfg) == []), \
                missing_round_workers(api, svc.cfg)
            assert all(t.not_ready() == [] for t in svc.trainers.values())
    assert os.path.ismount(small_disk)


def wait_until(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
