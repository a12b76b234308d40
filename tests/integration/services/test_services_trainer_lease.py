"""One active trainer per model (issue 13): two trainer processes of the planner model on the
real PostgreSQL and RabbitMQ. The second one waits (standby, a log line naming the holder)
while the first holds the store lease ``trainer:planner``: the first trains round 1, the
second trains nothing. After the first is SIGKILLed, the second takes the lease over once it
expired (MGRPO_TRAINER_LEASE_S=3 in these tests) and trains round 2."""

from __future__ import annotations

import re

import httpx
import pytest
from test_services_processes import run_round, start_system, wait_for

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(400)]


def holder_pid(store) -> int | None:
    lease = store.get_lease("trainer:planner")
    return int(lease.holder.split(":")[1]) if lease else None


def gauge(services, name: str, metric: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{services.ports[name]}/metrics", timeout=10).text
    return float(re.search(rf"^{metric} (\S+)$", text, re.M).group(1))


def test_second_trainer_waits_then_takes_over_after_the_first_dies(deployment):
    env, store, services = deployment
    start_system(services, trainers=("searcher", "coder"))
    first = services.start("trainer-planner-a", "trainer", "--model", "planner")
    services.wait_healthy("trainer-planner-a")
    assert wait_for(lambda: holder_pid(store) == first.pid, 60)
    second = services.start("trainer-planner-b", "trainer", "--model", "planner")
    services.wait_healthy("trainer-planner-b")
    assert wait_for(lambda: "waits (standby)" in services.log("trainer-planner-b"), 60), \
        services.log("trainer-planner-b")[-2000:]

    _, _, bus, record = run_round(env, store)
    rid = record.round_id
    assert wait_for(lambda: store.get_round(rid).status == "done"), \
        services.log("trainer-planner-a")[-2000:]
    # the "trained" line is logged after the round is marked done
    assert wait_for(lambda: f"round {rid} trained" in services.log("trainer-planner-a"), 60)
    assert "trained on" not in services.log("trainer-planner-b")
    assert gauge(services, "trainer-planner-b", "mgrpo_trainer_rounds_trained") == 0
    assert gauge(services, "trainer-planner-b", "mgrpo_trainer_lease_held") == 0
    assert gauge(services, "trainer-planner-a", "mgrpo_trainer_lease_held") == 1
    assert holder_pid(store) == first.pid
    ready = httpx.get(f"http://127.0.0.1:{services.ports['trainer-planner-b']}/readyz",
                      timeout=30)
    assert ready.status_code == 503, ready.text  # a standby takes no work
    assert any(p.startswith("standby: lease trainer:planner held by ")
               for p in ready.json()["problems"]), ready.text

    services.kill("trainer-planner-a")  # SIGKILL: no release, the lease must expire
    assert wait_for(lambda: holder_pid(store) == second.pid, 60)
    assert "lease trainer:planner taken by" in services.log("trainer-planner-b")
    readyz = f"http://127.0.0.1:{services.ports['trainer-planner-b']}/readyz"
    assert wait_for(lambda: httpx.get(readyz, timeout=30).status_code == 200, 60), \
        httpx.get(readyz, timeout=30).text  # once it consumes as the active one
    _, _, bus2, record2 = run_round(env, store)
    rid2 = record2.round_id
    assert wait_for(lambda: store.get_round(rid2).status == "done"), \
        services.log("trainer-planner-b")[-2000:]
    assert wait_for(lambda: f"round {rid2} trained" in services.log("trainer-planner-b"), 60)
    assert f"round {rid} trained" not in services.log("trainer-planner-b")
    assert [c.version for c in store.list_checkpoints("planner", run_id=record.run_id)] == [1, 2]
    bus.close()
    bus2.close()
