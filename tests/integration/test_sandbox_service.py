"""`mgrpo serve sandbox` as a real process: it starts, serves a call, and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from mgrpo.sandbox.client import SandboxClient
from mgrpo.sandbox.types import ExecRequest
from mgrpo.services.launcher import free_port


def test_mgrpo_serve_sandbox_serves_calls():
    port = free_port()
    mgrpo = Path(sys.executable).with_name("mgrpo")
    proc = subprocess.Popen([str(mgrpo), "serve", "sandbox", "--host", "127.0.0.1",
                             "--port", str(port), "--max-concurrency", "2"],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with SandboxClient(url) as client:
            result = client.execute(ExecRequest(code="print(sum(range(10)))"))
        assert (result.status, result.stdout) == ("ok", "45\n")
        ready = httpx.get(f"{url}/readyz", timeout=30)  # its self-test ran code
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught.
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
