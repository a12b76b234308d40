"""Sandbox throughput: calls/s for `print(1+1)`, in-process LocalSandbox vs the HTTP service.

Both sides run the same isolation (`--isolation`, default whatever `detect_isolation` finds
here); the HTTP column adds the FastAPI/uvicorn round trip and the queue. Sequential (one
caller) and concurrent (`--threads` callers) are measured separately. Writes JSON to stdout
and bench/results/sandbox-<mode>.json, with the load average before and after (the numbers
mean little on a busy machine). It does not measure isolation strength, only overhead.

    python bench/sandbox.py [--calls 200] [--threads 4] [--isolation bwrap|root|userns|none]
    python bench/sandbox.py --compare bwrap root [--calls 200]
    [--out FILE]   # instead of bench/results/

`--compare` alternates single in-process calls between the given modes (so a busy machine
slows each mode alike) and reports, per mode, latency percentiles and the CPU time the
jail's processes used per call (RUSAGE_CHILDREN: bwrap/unshare + launcher + child), the
figure that depends least on the load. Writes bench/results/sandbox-compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvicorn

from mgrpo.sandbox.app import create_app
from mgrpo.sandbox.client import SandboxClient
from mgrpo.sandbox.local import LocalSandbox, SandboxLimits
from mgrpo.sandbox.service import SandboxServiceSettings
from mgrpo.sandbox.types import ExecRequest
from mgrpo.web.server import server_options

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


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compare(modes: list[str], calls: int) -> dict:
    """Sequential calls alternating between `modes`: latency and jail CPU per call, per mode."""
    boxes = {mode: LocalSandbox(SandboxLimits(isolation=mode)) for mode in modes}
    for box in boxes.values():
        box.execute(REQUEST)  # warm-up
    wall: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu = dict.fromkeys(modes, 0.0)
    for _ in range(calls):
        for mode, box in boxes.items():
            c0, t0 = _children_cpu_s(), time.perf_counter()
            result = box.execute(REQUEST)
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode] += _children_cpu_s() - c0
            assert result.stdout == "2\n", result
    out = {}
    for mode in modes:
        ms = sorted(x * 1000 for x in wall[mode])
        out[mode] = {"calls": calls, "latency_ms_p50": round(statistics.median(ms), 1),
                     "latency_ms_p95": round(ms[int(0.95 * (len(ms) - 1))], 1),
                     "jail_cpu_ms_per_call": round(1000 * cpu[mode] / calls, 1)}
    return out


def serve_in_thread(max_concurrency: int,
                    sandbox: LocalSandbox) -> tuple[str, uvicorn.Server, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(SandboxServiceSettings(max_concurrency=max_concurrency), sandbox)
    server = uvicorn.Server(uvicorn.Config(app, **server_options(host="127.0.0.1", port=port,
                                                                 log_level="warning")))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--isolation", default="auto",
                        choices=["auto", "bwrap", "root", "userns", "none"])
    parser.add_argument("--compare", nargs="+", choices=["bwrap", "root", "userns", "none"])
    parser.add_argument("--out", type=Path, default=None, help="result file (default "
                        "bench/results/sandbox-<mode>.json, or sandbox-compare.json)")
    args = parser.parse_args()
    results_dir = Path(__file__).parent / "results"
    if args.compare:
        load_before = os.getloadavg()[0]
        results = {"snippet": REQUEST.code, "cpus": os.cpu_count(),
                   "machine": platform.platform(), **compare(args.compare, args.calls),
                   "loadavg_1m_before_after": [round(load_before, 2),
                                               round(os.getloadavg()[0], 2)]}
        text = json.dumps(results, indent=2)
        print(text)
        (args.out or results_dir / "sandbox-compare.json").write_text(text + "\n")
        return

    load_before = os.getloadavg()
    sandbox = LocalSandbox(SandboxLimits(isolation=args.isolation))
    sandbox.execute(REQUEST)  # warm-up: isolation probe, page cache
    url, server, thread = serve_in_thread(args.threads, sandbox)
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
    results["loadavg_1m_before_after"] = [round(load_before[0], 2),
                                          round(os.getloadavg()[0], 2)]
    client.close()
    server.should_exit = True
    thread.join(timeout=10)
    text = json.dumps(results, indent=2)
    print(text)
    out = args.out or results_dir / f"sandbox-{sandbox.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
