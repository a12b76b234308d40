"""Our servers keep an idle connection open longer than a client keeps one for reuse: else
the server closes it just as the client sends its next request on it, and that request
fails with "connection reset" (tests/integration/services/test_api_under_load.py's 200
clients, a sub-agent's sandbox client)."""

from __future__ import annotations

import http.client
import time

import httpx
from fastapi import FastAPI
from serving import running_server

from mgrpo.web.server import KEEP_ALIVE_S


def ask(connection: http.client.HTTPConnection) -> tuple[int, bytes]:
    connection.request("GET", "/ping")
    response = connection.getresponse()
    return response.status, response.read()


def test_an_idle_connection_outlives_httpx_keepalive_expiry():
    """One connection, idle 1 s longer than httpx keeps an idle one (5 s), then reused: the
    server answers on it (uvicorn's default, 5 s, had closed it)."""
    client_expiry = httpx.Limits().keepalive_expiry
    assert client_expiry + 10 < KEEP_ALIVE_S
    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    with running_server(app) as url:
        connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        try:
            assert ask(connection) == (200, b'{"ok":true}')
            first = connection.sock
            time.sleep(client_expiry + 1)
            try:
                again = ask(connection)
            except (http.client.RemoteDisconnected, ConnectionError) as error:
                again = error  # the server closed the idle connection
            same = connection.sock is first
        finally:
            connection.close()
    assert again == (200, b'{"ok":true}'), f"the idle connection was closed: {again!r}"
    assert same, "the answer came on another connection"
