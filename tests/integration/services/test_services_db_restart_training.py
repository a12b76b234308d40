"""A PostgreSQL restart while a trainer trains (the PRIVATE cluster, never the shared one).

The outage is placed where it hurt: right after a trainer wrote its version folder and
optimizer file, before ``store.record_checkpoint``. The record raises the transient
``OperationalError``; the retry finds the complete, unrecorded version with the same content
and records it, so the round ends ``done`` with every model at the same version (the retry
used to raise ``OptimizerStateError: ... exists already`` three times and fail the round).

The services run in this process on the in-memory bus (the classes ``mgrpo serve`` runs, on
the real PostgreSQL): the hook needs the trainer's thread, and the transport is not under
test here (``test_services_restart.py`` restarts the database under six processes).
"""

from __future__ import annotations

import threading
import time

from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    write_run_config,
)

import mgrpo.services.trainer.weights as trainer_weights
from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round
from mgrpo.store.admin import temporary_database

MODELS = ("planner", "searcher", "coder")


def wait_finished(store, round_id: str, timeout_s: float) -> str:
    """The round's status once it is done, failed or cancelled; a store error (the database
    restarting under the test's own reads) is a "not yet"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = store.get_round(round_id).status
        except Exception:  # noqa: BLE001
            status = None
        if status in ("done", "failed", "cancelled"):
            return status
        time.sleep(0.2)
    return store.get_round(round_id).status


def test_database_restart_between_checkpoint_write_and_record(private_postgres, tmp_path,
                                                              monkeypatch):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), name="dbr", k=2, queries=3)
    written = trainer_weights.save_checkpoint  # mgrpo.models.checkpoint's, as the trainer calls it
    stopped = threading.Event()
    restarted = threading.Event()

    def write_then_stop_the_database(model, root, name, version, **kwargs):
        uri = written(model, root, name, version, **kwargs)
        if name == "searcher" and not stopped.is_set():
            stopped.set()  # the folder is complete; the store record comes next
            private_postgres.stop()
            threading.Timer(3.0, lambda: (private_postgres.start(), restarted.set())).start()
        return uri

    monkeypatch.setattr(trainer_weights, "save_checkpoint", write_then_stop_the_database)
    with temporary_database(private_postgres.url) as url:
        settings = embedded_settings(tmp_path, cfg_path, database_url=url)
        try:
            with in_process_services(settings) as svc:
                record = start_round(svc.store, svc.bus, svc.cfg,
                                     Queues(settings.queue_prefix))
                status = wait_finished(svc.store, record.round_id, timeout_s=240)
                assert stopped.is_set(), "the hook never ran: the searcher wrote no checkpoint"
                assert restarted.wait(30)
                final = svc.store.get_round(record.round_id)
                assert status == "done", (status, final.error)
                versions = {m: svc.store.latest_checkpoint(m, run_id="dbr").version
                            for m in MODELS}
                assert versions == {m: 1 for m in MODELS}, versions
                for model in MODELS:
                    assert [c.version for c in svc.store.list_checkpoints(
                        model, run_id="dbr")] == [1]
        finally:
            restarted.wait(30)  # the cluster is up again for the fixture's next user
