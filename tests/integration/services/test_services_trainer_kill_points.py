"""A trainer SIGKILLed between its checkpoint record and the round's ``done`` (the real
PostgreSQL and RabbitMQ, each service its own process). The searcher's trainer kills itself
(``kill_point/sitecustomize.py``) exactly there, twice in one round: first right before it
publishes its group statistics (the checkpoint v1 recorded, nothing published), then, in its
replacement, right after the re-publish (every model published, the round not marked done).
A third trainer starts (each one a standby until the one before dies); the next pass of one
of the round's trainers marks it ``done``: each searcher trajectory stored once, exactly one
new version per model (the update is not applied again)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_services_processes import MODELS, run_round, start_system, wait_for

from mgrpo.services.trainer.readiness import expected_subagent_trajectories

pytestmark = pytest.mark.timeout(400)
KILL_KIT = Path(__file__).resolve().parent / "kill_point"


def start_searcher(services, name: str, kill_at: str = "", round_id: str = ""):
    """A searcher trainer process; with ``kill_at`` it SIGKILLs itself at that point of
    ``round_id`` (``kill_point/sitecustomize.py``)."""
    env = services.env
    if kill_at:
        services.env = {**env, "MGRPO_TEST_KILL_AT": kill_at, "MGRPO_TEST_KILL_ROUND": round_id,
                        "PYTHONPATH": os.pathsep.join([str(KILL_KIT), env["PYTHONPATH"]])}
    try:
        return services.start(name, "trainer", "--model", "searcher")
    finally:
        services.env = env


def killed(services, name: str) -> None:
    proc = services.procs[name]
    assert wait_for(lambda: proc.poll() is not None, 180), services.log(name)[-3000:]
    assert proc.returncode == -9, (proc.returncode, services.log(name)[-3000:])


def holder_pid(store) -> int | None:
    lease = store.get_lease("trainer:searcher")
    return int(lease.holder.split(":")[1]) if lease else None


def versions(store) -> dict[str, list[int]]:
    return {m: [c.version for c in store.list_checkpoints(m)] for m in MODELS}


def test_trainer_killed_around_its_publish_finishes_the_round_once(deployment):
    env, store, services = deployment
    start_system(services, trainers=("planner", "coder"))
    _, _, bus, record = run_round(env, store)
    rid = record.round_id
    # Without the searcher trainer the round cannot end: its trajectories wait in its queue.
    assert wait_for(lambda: store.round_progress(rid).done
                    and {"planner", "coder"} <= store.published_models(rid))
    rows, expected = expected_subagent_trajectories(store, "searcher", rid)
    assert rows == 6 and expected >= 6, (rows, expected)

    # Each replacement starts as a standby while the one before holds the lease, and takes
    # it over once the killed one's expired (MGRPO_TRAINER_LEASE_S=3 in these tests).
    first = start_searcher(services, "trainer-searcher-a", "before_publish", rid)
    assert wait_for(lambda: holder_pid(store) == first.pid, 120)
    second = start_searcher(services, "trainer-searcher-b", "after_publish", rid)
    killed(services, "trainer-searcher-a")
    recorded = store.list_checkpoints("searcher")
    assert [(c.version, c.round_id) for c in recorded] == [(1, rid)]
    assert "searcher" not in store.published_models(rid)

    assert wait_for(lambda: holder_pid(store) == second.pid, 120)
    start_searcher(services, "trainer-searcher-c")
    killed(services, "trainer-searcher-b")
    assert "resumes from v1" in services.log("trainer-searcher-b")
    assert store.published_models(rid) == set(MODELS)
    assert store.list_checkpoints("searcher") == recorded  # the update was not applied again

    assert wait_for(lambda: store.get_round(rid).status == "done", 120), \
        services.log("trainer-searcher-c")[-3000:]
    # left published, not done: the next pass of one of its trainers marked it done
    finished = [n for n in ("trainer-searcher-c", "trainer-planner", "trainer-coder")
                if f"round {rid} had every model's statistics published" in services.log(n)]
    assert len(finished) == 1, finished
    assert store.count_trajectories(rid, "searcher") == expected  # none lost, none twice
    trajs = store.round_trajectories(rid, "searcher")
    assert len(trajs) == len({(t.traj_id, t.attempt) for t in trajs}) == expected
    assert store.published_models(rid) == set(MODELS)
    assert store.read_group_stats(rid, model="searcher", agent="searcher")
    assert versions(store) == {m: [1] for m in MODELS}
    assert store.list_checkpoints("searcher") == recorded
    bus.close()
