"""Health that tells the truth, without a broker: a consumer whose thread died is a liveness
problem at once; one that is reconnecting is a readiness problem at once and a liveness
problem after the grace period; the worker's /healthz and /readyz serve exactly that. A
consume pass past its handler deadline gets its socket shut once and the consumer marked down
with the reason (on the real broker: tests/integration/services/test_services_hung_worker.py)."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

from http_json import get_json
from prometheus_client import CollectorRegistry
from waiting import wait_for

from mgrpo.bus.consumer import ConsumerState, HandlerDeadline
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


class _Socket:
    def __init__(self) -> None:
        self.shut: list[int] = []

    def shutdown(self, how: int) -> None:
        self.shut.append(how)


def _connection(sock: _Socket):
    return SimpleNamespace(connection=SimpleNamespace(transport=SimpleNamespace(sock=sock)))


def test_a_pass_past_the_handler_deadline_cuts_the_socket_once_and_says_why():
    state = ConsumerState("planner-worker", "planner.episodes")
    state.up()
    stop = threading.Event()
    deadline = HandlerDeadline(0.5, state, stop)
    try:
        quick, hung = _Socket(), _Socket()
        for _ in range(5):  # passes well within the deadline: nothing is cut
            deadline.enter(_connection(quick))
            time.sleep(0.05)
            deadline.leave()
        deadline.enter(_connection(hung))  # a handler that does not come back
        assert wait_for(lambda: hung.shut, timeout_s=10, poll_s=0.02)
        time.sleep(0.3)
        assert quick.shut == [] and hung.shut == [socket.SHUT_RDWR]  # once per pass
        assert deadline.cuts == 1 and not state.consuming
        problem = state.problem()
        assert "handler hung" in problem and "MGRPO_HANDLER_DEADLINE_S" in problem, problem
    finally:
        stop.set()


def test_a_consumer_that_keeps_reconnecting_is_a_liveness_problem():
    from mgrpo.bus.consumer import FLAP_LIMIT

    alive = threading.Event()
    thread = threading.Thread(target=alive.wait)
    thread.start()
    try:
        state = ConsumerState("planner-worker", "planner.episodes", thread=thread)
        for _ in range(FLAP_LIMIT):  # each time consuming again at once: never down for long
            state.down(RuntimeError("handler bug"))
            state.reconnected()
            state.up()
        assert "makes no progress (RuntimeError: handler bug)" in state.problem(grace_s=3600)
        state.recent_reconnects[0] -= 3600  # the first of them an hour ago: not flapping now
        assert state.problem(grace_s=3600) is None
    finally:
        alive.set()
        thread.join()
