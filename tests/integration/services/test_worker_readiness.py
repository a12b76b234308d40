"""A worker's ``/readyz`` tells the truth about what it needs (the real PostgreSQL, a PRIVATE
cluster that the test stops, and the real sandbox service): 200 while the store and the
sandbox answer, 503 within one probe of losing either, naming which, and 200 again once it
is back. Before, every worker said 200/200 through a database or sandbox outage while
progress sat at 0. The sandbox service's own ``/readyz`` runs a self-test: a sandbox that
cannot run code is 503 with the reason.

The worker's health server is the one ``mgrpo serve`` starts (``serve_health`` with
``worker_needs``), here without a model or a bus."""

from __future__ import annotations

import contextlib
import time

import httpx
from prometheus_client import CollectorRegistry
from serving import running_server

from mgrpo.sandbox.app import create_app
from mgrpo.sandbox.local import LocalSandbox
from mgrpo.services.dependencies import worker_needs
from mgrpo.services.health import serve_health
from mgrpo.services.launcher import free_port
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database


def readyz(port: int) -> tuple[int, list[str]]:
    response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
    return response.status_code, response.json().get("problems", [])


def test_readyz_turns_503_when_the_store_or_the_sandbox_is_gone(private_postgres):
    with temporary_database(private_postgres.url) as url, contextlib.ExitStack() as stack:
        store = Store(url)
        store.upgrade()
        stack.callback(store.close)
        sandbox = stack.enter_context(running_server(create_app()))
        port = free_port()
        server = serve_health(port, CollectorRegistry(), alive=lambda: True,
                              host="127.0.0.1", not_ready=worker_needs(store, sandbox))
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        assert readyz(port) == (200, [])

        private_postgres.stop()
        try:
            began = time.monotonic()
            status, problems = readyz(port)
            seconds = time.monotonic() - began
            assert status == 503 and any(p.startswith("store: the database does not answer")
                                         for p in problems), problems
            assert seconds < 10, seconds
        finally:
            private_postgres.start()
        assert readyz(port) == (200, [])

        stack.close()  # the sandbox service (and the rest) stop
        port = free_port()
        server = serve_health(port, CollectorRegistry(), alive=lambda: True,
                              host="127.0.0.1", not_ready=worker_needs(store, sandbox))
        try:
            status, problems = readyz(port)
            assert status == 503 and any(p.startswith(f"sandbox: {sandbox} does not answer")
                                         for p in problems), problems
        finally:
            server.shutdown()
            server.server_close()


class BrokenSandbox(LocalSandbox):
    def execute(self, request):
        raise OSError("bwrap: setting up uid map: Permission denied")


def test_sandbox_readyz_is_503_when_it_cannot_run_code():
    with running_server(create_app(sandbox=BrokenSandbox())) as url:
        response = httpx.get(f"{url}/readyz", timeout=30)
        assert response.status_code == 503, response.text
        assert response.json()["problems"] == [
            "self-test: OSError: bwrap: setting up uid map: Permission denied"]
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200  # alive: no restart
