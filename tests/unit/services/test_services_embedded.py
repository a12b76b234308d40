"""The distributed round's code path in ONE process: in-memory bus, SQLite store, scripted
policies (``services_testkit``), real tiny models in the trainers. Same services as in
production, so this catches orchestration bugs in seconds; the real-broker version is
``tests/integration/services``."""

from __future__ import annotations

import time

import pytest
from services_testkit import make_bench, make_tiny, write_run_config

from mgrpo.bus import InMemoryBus
from mgrpo.config import Settings
from mgrpo.services.context import Queues, load_service_config, open_store
from mgrpo.services.planner_worker import PlannerRuntime, PlannerWorker
from mgrpo.services.rounds import RoundConflict, start_round
from mgrpo.services.subagent_worker import SubagentWorker
from mgrpo.services.trainer import TrainerService


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc")
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), k=2, queries=3)
    settings = Settings(mode="embedded", database_url=f"sqlite:///{root}/store.db",
                        checkpoint_uri=str(root / "ckpt"), run_config=str(cfg_path),
                        engine="services_testkit:scripted_engine")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = InMemoryBus(store)
    for name, tool in (("searcher", "search"), ("coder", "python")):
        SubagentWorker(settings, cfg, store, bus, name, tool).start()
    planner = PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus))
    planner.start()
    trainers = {m: TrainerService(settings, cfg, store, bus, m, poll_s=0.1)
                for m in ("planner", "searcher", "coder")}
    for trainer in trainers.values():
        trainer.start()
    yield settings, cfg, store, bus, planner, trainers
    for trainer in trainers.values():
        trainer.stop()
    bus.close()


def wait_done(store, round_id: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = store.get_round(round_id).status
        if status in ("done", "failed", "cancelled"):
            return status
        time.sleep(0.1)
    return store.get_round(round_id).status


def test_round_runs_through_every_service(system):
    settings, cfg, store, bus, planner, trainers = system
    record = start_round(store, bus, cfg, Queues())
    with pytest.raises(RoundConflict, match="still in progress"):
        start_round(store, bus, cfg, Queues())
    assert wait_done(store, record.round_id) == "done"
    rid = record.round_id
    assert store.round_progress(rid).completed == 6
    assert store.published_models(rid) == {"planner", "searcher", "coder"}
    planner_trajs = store.round_trajectories(rid, "planner")
    assert len(planner_trajs) == 6 and {t.agent for t in planner_trajs} == {"planner"}
    for role in ("searcher", "coder"):
        trajs = store.round_trajectories(rid, role)
        assert {t.agent for t in trajs} <= {role} and {t.model for t in trajs} <= {role}
    searchers = store.round_trajectories(rid, "searcher")
    coders = store.round_trajectories(rid, "coder")
    # The scripted planner calls the searcher once or twice and the coder at most once.
    assert len(searchers) >= 6 and len(coders) >= 1
    assert len(searchers) + len(coders) == 12  # every episode makes exactly two calls
    assert sorted(store.d_counts("searcher") + store.d_counts("coder")) != []
    assert sum(store.d_counts("searcher")) == len(searchers)
    assert {c.model for c in store.list_checkpoints()} == {"planner", "searcher", "coder"}
    assert {c.version for c in store.list_checkpoints()} == {1}
    assert {a.name for a in store.list_agents()} == {"searcher", "coder"}


def test_next_round_uses_the_new_weights(system):
    settings, cfg, store, bus, planner, trainers = system
    record = start_round(store, bus, cfg, Queues())
    assert record.index == 1
    assert wait_done(store, record.round_id) == "done"
    versions = {t.weights_version for m in ("planner", "searcher", "coder")
                for t in store.round_trajectories(record.round_id, m)}
    assert versions == {1}
    assert {c.version for c in store.list_checkpoints("planner")} == {1, 2}
