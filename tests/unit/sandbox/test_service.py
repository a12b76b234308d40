"""The sandbox service over a real uvicorn on a free port: contract, queue, health, metrics."""

from __future__ import annotations

import select
import socket
import threading
import time

import httpx
import pytest
from serving import running_server

from mgrpo.sandbox.app import create_app
from mgrpo.sandbox.client import SandboxClient, SandboxUnavailable
from mgrpo.sandbox.service import SandboxServiceSettings
from mgrpo.sandbox.types import ExecRequest
from mgrpo.services.launcher import free_port


def test_execute_returns_the_contract_fields(service_url):
    resp = httpx.post(f"{service_url}/v1/execute",
                      json={"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                                    "sys.exit(3)", "timeout_s": 2, "memory_mb": 128})
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"status", "stdout", "stderr", "exit_code", "duration_s"}
    assert (body["status"], body["stdout"], body["stderr"], body["exit_code"]) == (
        "error", "out\n", "err\n", 3)


@pytest.mark.parametrize("body, field", [
    ({"code": "print(1)", "timeout_s": 0}, "timeout_s"),
    ({"code": "print(1)", "memory_mb": 1}, "memory_mb"),
    ({"timeout_s": 1}, "code"),
])
def test_bad_input_is_422_with_a_message_naming_the_field(service_url, body, field):
    resp = httpx.post(f"{service_url}/v1/execute", json=body)
    assert resp.status_code == 422
    assert field in resp.json()["message"]


def test_healthz_and_metrics_count_calls(service_url):
    with SandboxClient(service_url) as client:
        client.execute(ExecRequest(code="print(2)"))
    health = httpx.get(f"{service_url}/healthz").json()
    assert health["status"] == "ok" and health["isolation"] in {"bwrap", "root", "userns", "none"}
    metrics = httpx.get(f"{service_url}/metrics").text
    assert 'sandbox_calls_total{status="ok"}' in metrics
    assert "sandbox_running" in metrics and "sandbox_queued" in metrics


def test_full_queue_is_429_with_a_message():
    app = create_app(SandboxServiceSettings(max_concurrency=1, max_queue=0))
    with running_server(app) as url:
        slow = threading.Thread(target=httpx.post, args=(f"{url}/v1/execute",),
                                kwargs={"json": {"code": "import time\ntime.sleep(3)",
                                                 "timeout_s": 5}, "timeout": 30})
        slow.start()
        for _ in range(100):  # wait until the slow call holds the only slot
            if httpx.get(f"{url}/healthz").json()["running"] == 1:
                break
            time.sleep(0.05)
        resp = httpx.post(f"{url}/v1/execute", json={"code": "print(1)"})
        with SandboxClient(url, busy_retries=0) as client, \
                pytest.raises(SandboxUnavailable, match="429"):
            client.execute(ExecRequest(code="print(1)"))
        slow.join()
        after = httpx.post(f"{url}/v1/execute", json={"code": "print(1)"})
    assert resp.status_code == 429
    assert "max_queue=0" in resp.json()["detail"]
    assert int(resp.headers["Retry-After"]) >= 1
    assert after.json()["stdout"] == "1\n"


def test_client_says_where_it_looked_when_the_service_is_down():
    url = f"http://127.0.0.1:{free_port()}"
    with SandboxClient(url) as client, pytest.raises(SandboxUnavailable, match=url):
        client.execute(ExecRequest(code="print(1)"))


def _status_of_raw_request(url: str, head: bytes, chunks=()) -> tuple[int, int]:
    """Send a request head and body chunks on a raw socket, stopping as soon as the server
    answers; (status, body bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        for chunk in chunks:
            if select.select([sock], [], [], 0.01)[0]:
                break
            try:
                sock.sendall(chunk)
            except OSError:
                break
            sent += len(chunk)
        reply = sock.recv(4096)
    return int(reply.split(b" ", 2)[1]), sent


def test_a_huge_body_is_413_before_it_is_read():
    app = create_app(SandboxServiceSettings(max_body_bytes=1 << 20))
    with running_server(app) as url:
        declared = _status_of_raw_request(url, b"POST /v1/execute HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Type: application/json\r\n"
                                          b"Content-Length: 300000000\r\n\r\n")
        piece = b"x" * 65536
        chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 160  # 10 MB
        streamed = _status_of_raw_request(url, b"POST /v1/execute HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Type: application/json\r\n"
                                          b"Transfer-Encoding: chunked\r\n\r\n", chunks)
        small = httpx.post(f"{url}/v1/execute", json={"code": "print(1)"})
    assert declared == (413, 0)  # answered without waiting for a single body byte
    assert streamed[0] == 413 and streamed[1] < len(chunks) * len(chunks[0]) // 4
    assert small.json()["stdout"] == "1\n"


@pytest.mark.parametrize("body, status", [
    (b'{"code": "print(1)\\u0000"}', 200),  # fails to compile: an 'error' result, not a 500
    (b'{"code": "print(1)", "timeout_s": NaN}', 422),
    (b'{"code": "print(1)", "timeout_s": 1e400}', 422),
    (b'{"code": "print(1)", "memory_mb": 1e400}', 422),
])
def test_hostile_values_get_an_answer_not_a_500(service_url, body, status):
    resp = httpx.post(f"{service_url}/v1/execute", content=body,
                      headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    if status == 200:
        assert resp.json()["status"] == "error"
