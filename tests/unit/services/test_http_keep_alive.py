"""Our servers keep an idle connection open longer than a client keeps one for reuse: else
the server closes it just as the client sends its next request on it, and that request
fails with "connection reset" (tests/integration/services/test_api_under_load.py's 200
clients, a sub-agent's sandbox client)."""

from __future__ import annotations

import socket
import time

import httpx
from fastapi import FastAPI
from serving import running_server

from mgrpo.services.http import KEEP_ALIVE_S

REQUEST = b"GET /ping HTTP/1.1\r\nHost: test\r\n\r\n"


def ask(sock: socket.socket) -> bytes:
    sock.sendall(REQUEST)
    return sock.recv(4096)


def test_an_idle_connection_outlives_httpx_keepalive_expiry():
    """One connection, idle 1 s longer than httpx keeps an idle one (5 s), then reused: the
    server answers on it (uvicorn's default, 5 s, had closed it)."""
    client_expiry = httpx.Limits().keepalive_expiry
    assert client_expiry + 10 < KEEP_ALIVE_S
    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    with running_server(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert ask(sock).startswith(b"HTTP/1.1 200")
            time.sleep(client_expiry + 1)
            again = ask(sock)
    assert again.startswith(b"HTTP/1.1 200"), f"the idle connection was closed: {again!r}"
