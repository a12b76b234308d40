"""The distributed round's code path in ONE process: in-memory bus, SQLite store, scripted
policies (``services_testkit``), real tiny models in the trainers. Same services as in
production, so this catches orchestration bugs in seconds; the real-broker version is
``tests/integration/services``. The trainers' safety-net poll is an hour, so the rounds here
complete only through the event path (a trainer woken by what arrives on its queue)."""

from __future__ import annotations

import pytest
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    wait_done,
    write_run_config,
)

from mgrpo.services.context import Queues
from mgrpo.services.rounds import RoundConflict, start_round


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc")
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), k=2, queries=3)
    # an hour between safety-net polls: every round below completes only if the trainers
    # are woken by events (an ingested batch, the planner worker's round command)
    with in_process_services(embedded_settings(root, cfg_path), poll_s=3600) as svc:
        yield svc.settings, svc.cfg, svc.store, svc.bus, svc.planner, svc.trainers


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


def test_async_round_starts_while_the_previous_is_in_flight(system):
    """max_staleness 1 (run 'async' beside the fixture's): round 1 is admitted while round 0
    runs, round 2 waits for version 1 of every model; both rounds train in order, their
    samples at most one version behind."""
    from mgrpo.training.config import RunConfig

    settings, cfg, store, bus, planner, trainers = system
    acfg = RunConfig.model_validate({**cfg.model_dump(mode="json"), "name": "async",
                                     "max_staleness": 1, "loss": {"rollout_is": "token"}})
    r0 = start_round(store, bus, acfg, Queues())
    r1 = start_round(store, bus, acfg, Queues())
    assert (r0.index, r1.index) == (0, 1)
    if store.latest_checkpoint("searcher", run_id="async") is None:  # round 0 not trained yet
        with pytest.raises(RoundConflict, match="may start once versions"):
            start_round(store, bus, acfg, Queues())
    assert wait_done(store, r0.round_id) == "done" and wait_done(store, r1.round_id) == "done"
    for model in ("planner", "searcher", "coder"):
        assert [c.version for c in store.list_checkpoints(model, run_id="async")] == [1, 2]
        for index, rid in enumerate((r0.round_id, r1.round_id)):
            trajs = store.round_trajectories(rid, model)
            assert {t.weights_version for t in trajs} <= {0, index}
            staleness = store.metrics("async", rid)[rid].get(f"{model}/staleness_max", 0.0)
            assert 0 <= staleness <= index
