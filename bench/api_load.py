"""Load test of the planner API's POST /v1/queries: throughput, p50/p99, refusals, /healthz,
with and without an evaluation running.

Starts the planner API as a child process on loopback (SQLite store, in-memory bus, the
searcher and coder sub-agents in the same process, a freshly initialised tiny Qwen2 model
for all three agents on the real TorchEngine, so each query is real model work), then runs
``--clients`` concurrent clients that post queries back to back for ``--seconds`` while a
probe (a process of its own) calls ``/healthz`` and ``/readyz`` every 0.2 s. With
``--evaluation both`` (the default) each client count runs twice: alone, and while
evaluations run back to back (``POST /v1/evaluations``, polled until done, started again).
One server per ``--batch`` value (``MGRPO_QUERY_BATCH_SIZE``; 1 plays one query at a time).
Stops by itself and kills the server. Writes JSON to stdout and
bench/results/api_load.json, with the load average before and after each run: the machine
is shared, so the figures say what happened on it then, not what the API can do.

    python bench/api_load.py [--clients 20 200] [--seconds 20] [--in-flight 16]
                             [--batch 8 1] [--evaluation both|off|on]

It does NOT measure distributed mode (RabbitMQ, separate worker processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"
QUESTIONS = ["What is the population of Velmora?", "add 2 and 3",
             "Who founded Qualar Works?", "How many employees does Qualar Works have?"]


def serve(workdir: Path, port: int, in_flight: int, batch: int) -> None:
    """The child: build the tiny model, the bench and the app, then serve until killed."""
    import uvicorn
    import yaml

    from mgrpo.bus import InMemoryBus
    from mgrpo.config import Settings
    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.models import TinyModelConfig, init_tiny
    from mgrpo.services.api.app import create_app
    from mgrpo.services.api.deps import ApiState
    from mgrpo.services.context import load_service_config, open_store
    from mgrpo.services.subagent.worker import SubagentWorker
    from mgrpo.web.server import server_options

    tiny = init_tiny(workdir / "tiny", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400))
    bench = workdir / "bench"
    build_benchmark(BenchmarkConfig(seed=0, n_train=60, n_dev=20, n_test=20)).save(bench)
    config = {"name": "load", "seed": 0, "k": 2, "queries_per_round": 2,
              "models": {m: {"path": str(tiny)} for m in ("planner", "searcher", "coder")},
              "bench_dir": str(bench), "out_dir": str(workdir / "out"),
              "sampling": {"planner_max_turns": 3, "subagent_max_turns": 2,
                           "max_new_tokens": 16}}
    (workdir / "run.yaml").write_text(yaml.safe_dump(config))
    settings = Settings(mode="distributed", database_url=f"sqlite:///{workdir}/store.db",
                        run_config=str(workdir / "run.yaml"), api_token=TOKEN,
                        max_queries_in_flight=in_flight, query_batch_size=batch,
                        checkpoint_uri=str(workdir / "ckpt"))
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = InMemoryBus(store)
    for name, tool in (("searcher", "search"), ("coder", "python")):
        SubagentWorker(settings, cfg, store, bus, name, tool).start()
    uvicorn.run(create_app(ApiState(settings, cfg, store, bus)),
                **server_options(host="127.0.0.1", port=port, log_level="warning"))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probe_health(url: str, seconds: float) -> dict[str, tuple[list[float], int]]:
    """GET /healthz and /readyz every 0.2 s for ``seconds``; path -> (latencies, failures).
    Runs in its own process so the load clients' event loop does not delay it."""
    probed: dict[str, tuple[list[float], int]] = {"/healthz": ([], 0), "/readyz": ([], 0)}
    deadline = time.perf_counter() + seconds
    with httpx.Client(timeout=30) as http:
        while time.perf_counter() < deadline:
            for path, (latencies, failures) in list(probed.items()):
                started = time.perf_counter()
                try:
                    failed = http.get(f"{url}{path}").status_code != 200
                    latencies.append(time.perf_counter() - started)
                except httpx.HTTPError:
                    failed = True
                probed[path] = (latencies, failures + failed)
            time.sleep(0.2)
    return probed


async def evaluate_forever(http: httpx.AsyncClient, deadline: float) -> dict:
    """Evaluations back to back until ``deadline``: each started, polled until done (or, on
    the API before evaluations were background jobs, answered by the POST itself)."""
    done, played, failed, durations = 0, 0, 0, []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        response = await http.post("/v1/evaluations", headers=auth,
                                   json={"n_questions": 60, "split": "train"})
        if response.status_code == 200:  # the API before evaluations were jobs: synchronous
            done, played = done + 1, played + response.json()["n"]
            durations.append(time.perf_counter() - started)
            continue
        if response.status_code != 202:
            await asyncio.sleep(1)
            continue
        while True:
            job = (await http.get(response.headers["Location"])).json()
            if job["status"] != "running":
                break
            if time.perf_counter() > deadline:  # counted as far as it got
                played += job["played"]
                return {"evaluations_done": done, "evaluation_episodes": played,
                        "evaluations_failed": failed,
                        "evaluation_s": [round(d, 1) for d in durations]}
            await asyncio.sleep(0.5)
        done += job["status"] == "done"
        failed += job["status"] == "failed"
        played += job["played"]
        durations.append(time.perf_counter() - started)
    return {"evaluations_done": done, "evaluation_episodes": played,
            "evaluations_failed": failed, "evaluation_s": [round(d, 1) for d in durations]}


async def load(url: str, clients: int, seconds: float, evaluation: bool) -> dict:
    latencies: list[float] = []
    statuses: Counter = Counter()
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:

        auth = {"Authorization": f"Bearer {TOKEN}"}

        async def client(i: int) -> None:
            n = 0
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    r = await http.post("/v1/queries", headers=auth,
                                        json={"question": QUESTIONS[(i + n) % len(QUESTIONS)]})
                    statuses[r.status_code] += 1
                    if r.status_code == 200:
                        latencies.append(time.perf_counter() - started)
                    elif r.status_code == 429:  # back off as told, as a polite client would
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                except httpx.HTTPError as error:
                    statuses[type(error).__name__] += 1
                n += 1

        started = time.perf_counter()
        load_before = os.getloadavg()
        with multiprocessing.Pool(1) as pool:  # a process of its own: the 200 clients'
            probed = pool.apply_async(probe_health, (url, seconds))  # event loop would delay it
            evaluations = asyncio.gather(evaluate_forever(http, deadline)) if evaluation \
                else None
            await asyncio.gather(*(client(i) for i in range(clients)))
            evaluated = (await evaluations)[0] if evaluations is not None else {}
            probes = probed.get(timeout=seconds + 60)
        elapsed = time.perf_counter() - started
    health, health_failures = probes["/healthz"]
    ready, ready_failures = probes["/readyz"]
    return {"clients": clients, "evaluation_running": evaluation,
            "seconds": round(elapsed, 1),
            "answered": statuses.get(200, 0),
            "throughput_per_s": round(statuses.get(200, 0) / elapsed, 2),
            "p50_s": percentile(latencies, 0.5), "p99_s": percentile(latencies, 0.99),
            "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
            "errors_other_than_429": sum(v for k, v in statuses.items() if k not in (200, 429)),
            "healthz_probes": len(health), "healthz_failures": health_failures,
            "healthz_p50_s": percentile(health, 0.5),
            "healthz_max_s": max(health) if health else None,
            "readyz_probes": len(ready), "readyz_failures": ready_failures,
            "readyz_max_s": max(ready) if ready else None,
            **evaluated, "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def run_server(batch: int, args) -> list[dict]:
    """One server with this batch size; every (evaluation, clients) combination against it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    modes = {"both": [False, True], "off": [False], "on": [True]}[args.evaluation]
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen([sys.executable, __file__, "--serve", workdir, str(port),
                                   "--in-flight", str(args.in_flight), "--batch", str(batch)],
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            # warm-up: the first query loads the planner's model
            httpx.post(f"{url}/v1/queries", json={"question": QUESTIONS[0]}, timeout=300,
                       headers={"Authorization": f"Bearer {TOKEN}"})
            return [{"batch": batch, **asyncio.run(load(url, clients, args.seconds, evaluation))}
                    for evaluation in modes for clients in args.clients]
        finally:
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--evaluation", choices=["both", "off", "on"], default="both")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "api_load.json"))
    parser.add_argument("--serve", nargs=2, metavar=("WORKDIR", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), int(args.serve[1]), args.in_flight, args.batch[0])
        return

    load_before = os.getloadavg()
    runs = [run for batch in args.batch for run in run_server(batch, args)]
    result = {"in_flight": args.in_flight, "cpus": os.cpu_count(),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "runs": runs}
    for run in runs:
        for key in ("p50_s", "p99_s", "healthz_p50_s", "healthz_max_s", "readyz_max_s"):
            run[key] = None if run[key] is None else round(run[key], 3)
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
