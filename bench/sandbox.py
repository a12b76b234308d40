"""Sandbox throughput: calls/s for `print(1+1)`, in-process LocalSandbox vs the HTTP service.

Both sides run the same isolation (whatever `detect_isolation` finds here); the HTTP column
adds the FastAPI/uvicorn round trip and the queue. Sequential (one caller) and concurrent
(`--threads` callers) are measured separately. Writes JSON to stdout and
bench/results/sandbox.json. It does not measure isolation strength, only overhead.

    python bench/sandbox.py [--calls 200] [--threads 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvicorn

from mgrpo.sandbox.client import SandboxClient
from mgrpo.sandbox.local import LocalSandbox
from mgrpo.sandbox.service import SandboxServiceSettings
from mgrpo.sandbox.types import ExecRequest
from services.sandbox.app import create_app

REQUEST = ExecRequest(code="print(1+1)", timeout_s=5)


def measure(execute, calls: int, threads: int) -> dict:
    """calls/s and per-call latency percentiles (ms) of `calls` calls from `threads` callers."""
    latencies: list[float] = []

    def one(_: int) -> None:
        t0 = time.perf_counter()
        result = execute(REQUEST)
        latencies.append(time.perf_counter() - t0)
        assert result.stdout == "2\n", result

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(calls)))
    wall = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    return {"calls": calls, "threads": threads, "calls_per_s": round(calls / wall, 1),
            "latency_ms_p50": round(statistics.median(ms), 1),
            "latency_ms_p95": round(ms[int(0.95 * (len(ms) - 1))], 1)}


def serve_in_thread(max_concurrency: int) -> tuple[str, uvicorn.Server, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(SandboxServiceSettings(max_concurrency=max_concurrency))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()

    sandbox = LocalSandbox()
    sandbox.execute(REQUEST)  # warm-up: isolation probe, page cache
    url, server, thread = serve_in_thread(max_concurrency=args.threads)
    client = SandboxClient(url)
    client.execute(REQUEST)
    results = {
        "snippet": REQUEST.code, "isolation": sandbox.mode, "cpus": os.cpu_count(),
        "machine": platform.platform(), "python": platform.python_version(),
        "local_sequential": measure(sandbox.execute, args.calls, 1),
        "http_sequential": measure(client.execute, args.calls, 1),
        "local_concurrent": measure(sandbox.execute, args.calls, args.threads),
        "http_concurrent": measure(client.execute, args.calls, args.threads),
    }
    client.close()
    server.should_exit = True
    thread.join(timeout=10)
    text = json.dumps(results, indent=2)
    print(text)
    out = Path(__file__).parent / "results" / "sandbox.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
