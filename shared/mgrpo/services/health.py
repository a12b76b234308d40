"""``/healthz``, ``/readyz`` and ``/metrics`` for worker services (no web framework): a stdlib
HTTP server on a daemon thread, port ``MGRPO_HEALTH_PORT`` (9100).

- ``/healthz`` (liveness: "restart me if not 200"): 200 while ``alive()`` and ``problems()``
  lists nothing, else 503 with the problems. A worker passes its bus's consumers here
  (``KombuBus.consumer_problems(grace_s)``): a consumer thread that died, or one that has not
  consumed for ``grace_s``, makes the process unhealthy, so an orchestrator restarts it.
- ``/readyz`` (readiness): 200 when ``not_ready()`` lists nothing, else 503 with why (a
  consumer reconnecting right now, before the grace period is over).
- ``/metrics``: the Prometheus text of ``registry``.

What this module does NOT do: check the database (the planner API's ``/readyz`` does).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve_health(port: int, registry: CollectorRegistry, alive: Callable[[], bool],
                 host: str = "0.0.0.0", info: Callable[[], dict] | None = None,
                 problems: Callable[[], list[str]] | None = None,
                 not_ready: Callable[[], list[str]] | None = None) -> ThreadingHTTPServer:
    """Start the server; returns it (``.server_address[1]`` is the port, ``.shutdown()``)."""

    def report(ok: bool, found: list[str], up: str, down: str) -> tuple[int, bytes]:
        body = {"status": up if ok else down, **(info() if info else {})}
        if found:
            body["problems"] = found
        return (200 if ok else 503), json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path.startswith("/healthz"):
                found = problems() if problems else []
                status, body = report(alive() and not found, found, "ok", "down")
                self._send(status, body, "application/json")
            elif self.path.startswith("/readyz"):
                found = (problems() if problems else []) + (not_ready() if not_ready else [])
                found = list(dict.fromkeys(found))
                status, body = report(alive() and not found, found, "ready", "not ready")
                self._send(status, body, "application/json")
            elif self.path.startswith("/metrics"):
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b'{"detail": "not found: try /healthz, /readyz or /metrics"}',
                           "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # probes every few seconds: keep logs clean
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
