"""Health that tells the truth, without a broker: a consumer whose thread died is a liveness
problem at once; one that is reconnecting is a readiness problem at once and a liveness
problem after the grace period; the worker's /healthz and /readyz serve exactly that."""

from __future__ import annotations

import threading

from http_json import get_json
from prometheus_client import CollectorRegistry

from mgrpo.bus.consumer import ConsumerState
from mgrpo.services.health import serve_health


def test_dead_thread_and_disconnected_consumer_are_problems():
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    state = ConsumerState("planner-worker", "planner.episodes", thread=dead)
    state.up()
    assert "thread is dead" in state.problem(grace_s=3600)

    alive = threading.Event()
    thread = threading.Thread(target=alive.wait)
    thread.start()
    try:
        state = ConsumerState("trainer-planner", "trainer.planner", thread=thread)
        state.up()
        assert state.problem() is None
        state.down(ConnectionResetError(104, "Connection reset by peer"))
        assert "ConnectionResetError" in state.problem(grace_s=0.0)
        assert state.problem(grace_s=60.0) is None  # still within the grace period
        state.since -= 61
        assert "not consuming for 61 s" in state.problem(grace_s=60.0)
        state.stopped = True  # told to stop: the process is going away anyway
        assert state.problem() is None
    finally:
        alive.set()
        thread.join()


def test_healthz_and_readyz_report_the_problems():
    problems: list[str] = []
    waiting: list[str] = []
    server = serve_health(0, CollectorRegistry(), alive=lambda: True, host="127.0.0.1",
                          info=lambda: {"service": "subagent-coder"},
                          problems=lambda: list(problems), not_ready=lambda: list(waiting))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get_json(f"{url}/healthz") == (200, {"status": "ok", "service": "subagent-coder"})
        assert get_json(f"{url}/readyz") == (200, {"status": "ready", "service": "subagent-coder"})
        waiting.append("consumer c on q: not consuming for 0 s (connecting)")
        assert get_json(f"{url}/healthz")[0] == 200  # reconnecting: not yet a reason to restart
        status, body = get_json(f"{url}/readyz")
        assert status == 503 and body["problems"] == waiting
        problems.append("consumer c on q: thread is dead (stopped)")
        status, body = get_json(f"{url}/healthz")
        assert status == 503 and body["status"] == "down" and body["problems"] == problems
    finally:
        server.shutdown()
