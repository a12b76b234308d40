"""A small soak: several rounds through the services while the (PRIVATE) PostgreSQL restarts
at a random point of each round, against an undisturbed run of the same config. Every round
ends ``done`` with exact counts (each rollout completed once, one planner trajectory per
rollout), every model at the same version, and the final weights (every model's moved from
the start) equal the undisturbed run's bit for bit (a retried episode replays its draws; a
retried update starts from the recorded weights and optimizer state).

In this process on the in-memory bus (the classes ``mgrpo serve`` runs): the database is
what restarts. The soak through processes, with worker kills and a broker restart too, is
``test_services_soak_processes.py``."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from safetensors.torch import load_file
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    write_run_config,
)

from mgrpo.models.checkpoint import read_checkpoint_dir
from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round
from mgrpo.store.admin import temporary_database

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

MODELS = ("planner", "searcher", "coder")
ROUNDS = 4


def _retrying(call, timeout_s: float = 120):
    """``call()``, again while the database restarts under it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _play(url: str, root, cfg_path, postgres=None, seed: int = 0) -> dict:
    """ROUNDS rounds; with ``postgres``, a restart at a random point of each. Returns the
    final weights per model."""
    rng = random.Random(seed)
    # the planner's answer and a sub-agent's return malformed on odd seeds: rewards differ
    # within a group and every model's weights move (the plain scripted policy's never do,
    # and equal weights would say nothing)
    settings = embedded_settings(root, cfg_path, database_url=url,
                                 engine="services_testkit:varied_team_engine")
    mid_round: list[str] = []  # the restarts that hit an unfinished round (and its phase)
    with in_process_services(settings) as svc:
        for _ in range(ROUNDS):
            record = _retrying(lambda: start_round(svc.store, svc.bus, svc.cfg,
                                                   Queues(settings.queue_prefix)))

            def restart_now(rid=record.round_id) -> None:
                status = svc.store.get_round(rid).status
                if status in ("running", "training"):
                    mid_round.append(status)
                postgres.restart(down_s=2.0)

            restart = None
            if postgres is not None:
                restart = threading.Timer(rng.uniform(0.0, 4.0), restart_now)
                restart.start()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                status = _retrying(lambda rid=record.round_id: svc.store.get_round(rid).status)
                if status in ("done", "failed", "cancelled"):
                    break
                time.sleep(0.2)
            if restart is not None:
                restart.join()
            final = _retrying(lambda rid=record.round_id: svc.store.get_round(rid))
            assert final.status == "done", (final.round_id, final.status, final.error)
            progress = _retrying(lambda rid=record.round_id: svc.store.round_progress(rid))
            assert progress.completed == progress.total == 6
            planner = svc.store.round_trajectories(record.round_id, "planner")
            assert len({t.traj_id for t in planner}) == len(planner) == 6
        if postgres is not None:
            print(f"database restarts during a round: {mid_round}")
            assert len(mid_round) >= ROUNDS // 2, mid_round
        versions = {m: svc.store.latest_checkpoint(m, run_id="soak") for m in MODELS}
        assert {m: c.version for m, c in versions.items()} == {m: ROUNDS for m in MODELS}
        return {m: read_checkpoint_dir(c.uri)[0] for m, c in versions.items()}


def test_rounds_through_database_restarts_end_like_an_undisturbed_run(private_postgres,
                                                                      tmp_path):
    tiny = make_tiny(tmp_path / "tiny")
    cfg_path = write_run_config(tmp_path / "run.yaml", tiny, make_bench(tmp_path / "bench"),
                                name="soak", k=2, queries=3)
    with temporary_database(private_postgres.url) as url:
        calm = _play(url, tmp_path / "calm", cfg_path)
    with temporary_database(private_postgres.url) as url:
        stormy = _play(url, tmp_path / "stormy", cfg_path, postgres=private_postgres, seed=28)
    start = load_file(tiny / "model.safetensors")
    moved = {model: any(not torch.equal(calm[model][key], start[key])
                        for key in calm[model].keys() & start.keys()) for model in MODELS}
    assert all(moved.values()), f"weights moved from the start: {moved}"
    for model in MODELS:
        assert calm[model].keys() == stormy[model].keys()
        for key in calm[model]:
            torch.testing.assert_close(stormy[model][key], calm[model][key], rtol=0, atol=0,
                                       msg=f"{model} {key}")
