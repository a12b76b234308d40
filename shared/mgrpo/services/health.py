"""``/healthz`` and ``/metrics`` for worker services (no web framework): a stdlib HTTP server
on a daemon thread, port ``MGRPO_HEALTH_PORT`` (9100). ``/healthz`` is 200 while the
``alive`` callable says so, else 503; ``/metrics`` is the Prometheus text of ``registry``.

What this module does NOT do: readiness of dependencies (the planner API's ``/readyz`` does).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve_health(port: int, registry: CollectorRegistry, alive: Callable[[], bool],
                 host: str = "0.0.0.0", info: Callable[[], dict] | None = None
                 ) -> ThreadingHTTPServer:
    """Start the server; returns it (``.server_address[1]`` is the port, ``.shutdown()``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path.startswith("/healthz"):
                ok = alive()
                body = json.dumps({"status": "ok" if ok else "down", **(info() if info else {})})
                self._send(200 if ok else 503, body.encode(), "application/json")
            elif self.path.startswith("/metrics"):
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b'{"detail": "not found: try /healthz or /metrics"}',
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
