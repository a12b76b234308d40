"""Whole rounds through the service processes (planner worker, two sub-agents, three trainers)
on a PRIVATE RabbitMQ and PostgreSQL, interrupted mid-round by ``rabbitmqctl stop_app`` /
``start_app`` and then by a PostgreSQL restart: both rounds finish ``done`` with every rollout
completed once, one planner trajectory per rollout, d_k trajectories per sub-agent, nothing
dead-lettered, and no worker restarted by hand. While the broker is down every worker's
``/healthz`` says 503 and ``/readyz`` says which consumer is not consuming; both are 200 again
once it is back."""

from __future__ import annotations

import time

import httpx
import pytest
from test_services_processes import MODELS, run_round, start_system

from mgrpo.services.trainer.service import expected_subagent_trajectories

pytestmark = pytest.mark.heavy


def wait_for(predicate, timeout_s: float) -> bool:
    """Polls; an error (the database restarting under the test's own store) is a "not yet"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.2)
    return predicate()


def health(services, name: str, path: str) -> tuple[int, dict]:
    response = httpx.get(f"http://127.0.0.1:{services.ports[name]}{path}", timeout=10)
    return response.status_code, response.json()


def round_stuck(store, services, rid: str) -> str:
    """What a round that did not end looks like: its status, progress and every worker's
    last log lines (a stuck trainer says why in its own log, not the planner's)."""
    tails = "\n".join(f"--- {name}\n{services.log(name)[-1500:]}" for name in services.procs)
    return (f"{store.get_round(rid).status} {store.round_progress(rid)}\n{tails}")


def check_round(store, bus, rid: str) -> None:
    record = store.get_round(rid)
    assert record.status == "done", record.status
    progress = store.round_progress(rid)
    assert progress.completed == progress.total == 6
    assert store.published_models(rid) == set(MODELS)
    assert len(store.round_trajectories(rid, "planner")) == 6  # one per rollout, no more
    assert len({t.traj_id for t in store.round_trajectories(rid, "planner")}) == 6
    for role in ("searcher", "coder"):
        trajs = store.round_trajectories(rid, role)
        rows, expected = expected_subagent_trajectories(store, role, rid)
        assert rows == 6 and len(trajs) == expected, (role, rows, expected, len(trajs))
        # the scripted planner always searches first; it calls the coder only on an even
        # turn seed, so a round of 6 rollouts can have no coder call (1 in 64)
        assert expected > 0 or role == "coder", (role, rows, expected)
        assert len({(t.traj_id, t.attempt) for t in trajs}) == len(trajs)
    assert len(store.read_planner_outcomes(rid)) >= 6
    assert bus.peek_dead_letters() == []


def test_round_survives_broker_and_database_restarts(private_deployment):
    env, store, services, postgres, rabbitmq = private_deployment
    # 2 s per generate call: the round must outlast a `stop_app` on a loaded machine (with
    # 1 s, event-driven rounds ended in ~20 s, before a slow `stop_app` returned)
    services.env.update(MGRPO_CONSUMER_GRACE_S="2", MGRPO_TEST_GENERATE_DELAY_S="2.0")
    start_system(services)
    workers = ["planner-worker", "subagent-searcher", "subagent-coder"] + \
        [f"trainer-{m}" for m in MODELS]

    # 1. the broker stops and starts mid-round
    _, _, bus, record = run_round(env, store)
    stopped = False
    try:
        time.sleep(1.0)  # the planner worker has its first batch (the round takes ~40 s)
        rabbitmq.stop_app()
        stopped = True
        assert store.get_round(record.round_id).status != "done", "not mid-round"
        # every worker notices: an idle consumer at once, one busy in a batch when it next
        # publishes; past the 2 s grace /healthz is 503, /readyz says why
        assert wait_for(lambda: all(health(services, n, "/healthz")[0] == 503
                                    for n in workers), 60), \
            {n: health(services, n, "/healthz") for n in workers}
        for name in workers:
            status, body = health(services, name, "/readyz")
            assert status == 503 and any("not consuming" in p or "cannot reach" in p
                                         for p in body["problems"]), (name, body)
        rabbitmq.start_app()
        stopped = False
        assert wait_for(lambda: store.get_round(record.round_id).status == "done", 240), \
            round_stuck(store, services, record.round_id)
        assert wait_for(lambda: all(health(services, n, "/readyz")[0] == 200
                                    for n in workers), 60)
        assert all(health(services, n, "/healthz")[0] == 200 for n in workers)
        assert services.dead() == []
        check_round(store, bus, record.round_id)
    finally:
        if stopped:  # a failure above: leave the broker up for the teardown
            rabbitmq.start_app()
        bus.close()

    # 2. PostgreSQL restarts mid-round
    _, _, bus, record = run_round(env, store)
    try:
        time.sleep(1.0)
        postgres.restart(down_s=3.0)
        assert store.get_round(record.round_id).status != "done", "not mid-round"
        assert wait_for(lambda: store.get_round(record.round_id).status == "done", 240), \
            round_stuck(store, services, record.round_id)
        assert services.dead() == []
        check_round(store, bus, record.round_id)
        assert all(health(services, n, "/healthz")[0] == 200 for n in workers)
    finally:
        bus.close()
