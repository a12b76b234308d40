"""A trainer that hangs without dying (SIGSTOP) on the real PostgreSQL and RabbitMQ: the
standby takes its lease when it expires (MGRPO_TRAINER_LEASE_S=3 here), and the broker
gives the hung process's prefetched trajectories to the standby once it misses ~2 AMQP
heartbeats of the trainer's ingest consumer (MGRPO_TRAINER_HEARTBEAT_S, 15 s by default:
about 30 s). So the round ends within a bound well under the workers' 120 s heartbeat
(~4 minutes before): here 120 s from the SIGSTOP on this loaded machine. When the hung
process resumes (SIGCONT) it finds its lease gone and writes nothing: the round's planner
trajectories are each stored once, and one checkpoint exists."""

from __future__ import annotations

import signal
import time

import pytest
from test_services_processes import run_round, start_system, wait_for

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(500)]

BOUND_S = 120


def holder_pid(store) -> int | None:
    lease = store.get_lease("trainer:planner")
    return int(lease.holder.split(":")[1]) if lease else None


def test_a_hung_trainer_stalls_its_round_for_a_bounded_time(deployment):
    env, store, services = deployment
    start_system(services, trainers=("searcher", "coder"))
    hung = services.start("trainer-planner-a", "trainer", "--model", "planner")
    services.wait_healthy("trainer-planner-a")
    assert wait_for(lambda: holder_pid(store) == hung.pid, 60)
    standby = services.start("trainer-planner-b", "trainer", "--model", "planner")
    services.wait_healthy("trainer-planner-b")
    assert wait_for(lambda: "waits (standby)" in services.log("trainer-planner-b"), 60)

    _, _, bus, record = run_round(env, store)
    rid = record.round_id
    hung.send_signal(signal.SIGSTOP)  # its prefetch window takes the round's trajectories
    stopped_at = time.monotonic()
    try:
        assert wait_for(lambda: holder_pid(store) == standby.pid, 60)
        assert wait_for(lambda: store.get_round(rid).status == "done", BOUND_S + 60), \
            (store.get_round(rid).status, services.log("trainer-planner-b")[-3000:])
        took = time.monotonic() - stopped_at
        print(f"round done {took:.1f} s after the SIGSTOP")
        assert took < BOUND_S, took
    finally:
        hung.send_signal(signal.SIGCONT)
    assert wait_for(lambda: f"round {rid} trained" in services.log("trainer-planner-b"), 60)
    time.sleep(5)  # the resumed process runs on: it must not train or write
    assert f"round {rid} trained" not in services.log("trainer-planner-a")
    assert [c.version for c in store.list_checkpoints("planner", run_id=record.run_id)] == [1]
    trajs = store.round_trajectories(rid, "planner")
    assert len(trajs) == 6 and len({t.traj_id for t in trajs}) == 6
    assert services.dead() == []
    bus.close()
