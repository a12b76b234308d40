"""A standby trainer (a second trainer of a model, not holding the store lease
``trainer:<model>``) says so on ``/readyz``: 503 with ``standby: lease trainer:<model> held by
<holder> until <time>``, while its ``/healthz`` stays 200 (a restart would not make it the
active one). It cannot progress a round, so it is not ready; once the active trainer stops
and releases the lease, the standby takes it over and turns 200. (Before, both said 200.)

Two real :class:`TrainerService`s of the tiny planner model on a SQLite store and the
in-memory bus, each behind the health server ``mgrpo serve trainer`` starts."""

from __future__ import annotations

import contextlib

import httpx
from prometheus_client import CollectorRegistry
from services_testkit import embedded_settings, make_bench, make_tiny, write_run_config
from waiting import wait_for

from mgrpo.bus import InMemoryBus
from mgrpo.services.context import load_service_config, open_store
from mgrpo.services.health import serve_health
from mgrpo.services.launcher import free_port
from mgrpo.services.trainer.service import TrainerService


def probe(port: int, path: str) -> tuple[int, list[str]]:
    response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30)
    return response.status_code, response.json().get("problems", [])


def test_a_standby_trainer_is_not_ready_and_names_the_holder(tmp_path):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), name="standby")
    settings = embedded_settings(tmp_path, cfg_path, trainer_lease_s=1.5)
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = InMemoryBus(store)
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        stack.callback(bus.close)
        ports = {}
        trainers = {}
        for name in ("active", "standby"):
            trainer = TrainerService(settings, cfg, store, bus, "planner")
            trainer.start()
            stack.callback(trainer.stop)
            trainers[name] = trainer
            if name == "active":
                assert wait_for(trainer.lease.held, timeout_s=30)
            ports[name] = free_port()
            server = serve_health(ports[name], CollectorRegistry(), alive=lambda: True,
                                  host="127.0.0.1", not_ready=trainer.not_ready)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
        active, standby = trainers["active"], trainers["standby"]

        assert probe(ports["active"], "/readyz") == (200, [])
        status, problems = probe(ports["standby"], "/readyz")
        assert status == 503, problems
        assert len(problems) == 1 and problems[0].startswith(
            f"standby: lease trainer:planner held by {active.lease.holder} until "), problems
        assert probe(ports["standby"], "/healthz") == (200, [])

        active.stop()  # a clean stop releases the lease: the standby takes it over
        assert wait_for(standby.lease.held, timeout_s=30)
        assert probe(ports["standby"], "/readyz") == (200, [])
