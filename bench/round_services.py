"""The round bench's harness, part 2: a round through the services. :func:`distributed_round`
runs every service as its own process (``mgrpo serve ...``) on the local RabbitMQ and a fresh
PostgreSQL database; :func:`inprocess_round` runs the same service classes in this process on
the in-memory bus and SQLite. Both start the round with ``start_round`` (what
``POST /v1/rounds`` calls) and time it until its status is ``done`` (:func:`timed_round`).

What it does NOT do: compare rounds (``round_harness``) or write results (``round``).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import UTC
from pathlib import Path

import yaml
from round_harness import RoundData, read_round

from mgrpo.services.launcher import ServiceProcesses
from mgrpo.tools import ROLE_TOOLS


def service_argv(cfg, replicas: dict[str, int] | None = None) -> dict[str, list[str]]:
    """The services a round of ``cfg`` needs (name -> argv after ``mgrpo``): a sub-agent
    worker per sub-agent role (none for ``grpo``: the single agent plays them inline), the
    planner worker, and a trainer per model (a frozen model's trainer scores, never updates).

    ``replicas``: how many processes of a worker (``planner-worker``, ``subagent-<role>``)
    share its queue (competing consumers); replica i > 1 is named ``<name>-<i>``. Trainers
    are one per model (a store lease makes a second one a standby) and are refused here."""
    out = _one_each(cfg)
    for name, count in (replicas or {}).items():
        if name not in out or name.startswith("trainer-") or count < 1:
            raise ValueError(f"replicas: {name!r}={count} is not a worker of this round "
                             f"(one of {[n for n in out if not n.startswith('trainer-')]}, "
                             "count >= 1); trainers are one per model")
        for i in range(2, count + 1):
            out[f"{name}-{i}"] = out[name]
    return out


def _one_each(cfg) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if cfg.algorithm != "grpo":
        for role in (r for r in cfg.agents if r != "planner"):
            # a sub-agent that delegates (nested) has no tool unless role_tools names one
            tool = cfg.role_tools.get(role) or ("" if cfg.delegation.get(role)
                                                else ROLE_TOOLS[role])
            out[f"subagent-{role}"] = ["serve", "subagent", "--name", role,
                                       *(["--tool", tool] if tool else [])]
    out["planner-worker"] = ["serve", "planner-worker"]
    for model in dict.fromkeys(cfg.agents.values()):
        out[f"trainer-{model}"] = ["serve", "trainer", "--model", model]
    return out


def start_services(procs: ServiceProcesses, cfg, replicas: dict[str, int] | None = None) -> float:
    """Start :func:`service_argv`'s processes; returns seconds until all are healthy."""
    started = time.perf_counter()
    for name, argv in service_argv(cfg, replicas).items():
        procs.start(name, *argv)
    procs.wait_healthy(timeout_s=900)  # six processes loading torch on a loaded machine
    return time.perf_counter() - started


def distributed_round(cfg, postgres_url: str, broker_url: str, workdir: Path,
                      timeout_s: float = 600.0, replicas: dict[str, int] | None = None,
                      logs_to: Path | None = None, warmup: int = 0) -> RoundData:
    """One round through separate service processes, on a fresh database and queue prefix
    (``replicas``: see :func:`service_argv`; ``logs_to``: a folder the service logs are
    copied to; ``warmup`` = W: the same processes play rounds 0..W-1 first, untimed, and
    round W is the one timed and read). ``work`` of the result: the episodes or calls
    each worker process served (its /metrics gauge), read once the round is done."""
    from mgrpo.bus.kombu_bus import KombuBus
    from mgrpo.services.context import Queues
    from mgrpo.store import Store
    from mgrpo.store.admin import temporary_database

    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "run.yaml"  # sort_keys=False: agent order is the planner's header
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    prefix = f"b{uuid.uuid4().hex[:10]}."
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        env = {**os.environ, "MGRPO_MODE": "distributed", "MGRPO_DATABASE_URL": url,
               "MGRPO_BROKER_URL": broker_url, "MGRPO_RUN_CONFIG": str(config_file),
               "MGRPO_QUEUE_PREFIX": prefix, "MGRPO_CHECKPOINT_URI": str(workdir / "ckpt"),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",  # one thread per process
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("MGRPO_ENGINE", None)  # real tiny models, not a scripted policy
        procs = ServiceProcesses(env, workdir)
        bus = KombuBus(broker_url, store, dead_letter_queue_name=Queues(prefix).dead_letter)
        try:
            startup = start_services(procs, cfg, replicas)

            def logs() -> str:
                return "\n".join(f"--- {n}\n{procs.log(n)[-1500:]}" for n in procs.procs)

            for _ in range(warmup):
                _timed_round(store, bus, cfg, Queues(prefix), logs, timeout_s)
            before = process_usage(procs)
            data = _timed_round(store, bus, cfg, Queues(prefix), logs, timeout_s)
            after = process_usage(procs)
            data.split["startup_s"] = startup
            data = _with_results(data, read_round(store, cfg, f"{cfg.name}-r{warmup:04d}",
                                                  str(workdir / "ckpt"), version=warmup + 1))
            data.work = worker_counts(procs)
            data.usage = {name: {"peak_rss_mb": got["peak_rss_mb"],
                                 "rss_at_start_mb": before[name]["rss_mb"],
                                 "cpu_s": round(got["cpu_s"] - before[name]["cpu_s"], 3)}
                          for name, got in after.items() if name in before}
        finally:
            procs.stop_all()
            if logs_to is not None:  # the services' logs (phase timings) outlive the run
                logs_to.mkdir(parents=True, exist_ok=True)
                for name in procs.procs:
                    (logs_to / f"{name}.log").write_text(procs.log(name))
            bus.close()
            delete_queues(broker_url, prefix, procs, cfg)
            store.close()
    return data


def inprocess_round(cfg, workdir: Path, timeout_s: float = 600.0) -> RoundData:
    """The same services as :func:`distributed_round` (planner worker, sub-agent workers,
    trainers: the classes ``mgrpo serve`` runs), in THIS process on the in-memory bus and a
    SQLite store: the distributed code path without process start-up or a broker."""
    from mgrpo.bus import InMemoryBus
    from mgrpo.config import Settings
    from mgrpo.services.context import Queues, open_store
    from mgrpo.services.planner.worker import PlannerRuntime, PlannerWorker
    from mgrpo.services.subagent.worker import SubagentWorker
    from mgrpo.services.trainer.service import TrainerService

    workdir.mkdir(parents=True, exist_ok=True)
    settings = Settings(mode="embedded", database_url=f"sqlite:///{workdir / 'store.db'}",
                        checkpoint_uri=str(workdir / "ckpt"), engine="torch")
    store = open_store(settings)
    bus = InMemoryBus(store)
    trainers = []
    try:
        for argv in service_argv(cfg).values():
            if argv[1] == "subagent":
                tool = argv[argv.index("--tool") + 1] if "--tool" in argv else ""
                SubagentWorker(settings, cfg, store, bus, argv[3], tool).start()
            elif argv[1] == "trainer":
                trainers.append(TrainerService(settings, cfg, store, bus, argv[3]))
                trainers[-1].start()
        PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus)).start()
        data = _timed_round(store, bus, cfg, Queues(), lambda: "(see the log above)",
                            timeout_s)
        return _with_results(data, read_round(store, cfg, f"{cfg.name}-r0000",
                                              str(workdir / "ckpt")))
    finally:
        for trainer in trainers:
            trainer.stop()
        bus.close()
        store.close()


def wait_round(store, round_id: str, timeout_s: float, logs=lambda: "") -> None:
    """Until ``round_id`` is ``done``; a failed, cancelled or late round raises."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = store.get_round(round_id).status
        if status == "done":
            return
        if status in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"round {round_id} ended {status!r}:\n{logs()}")
        time.sleep(0.05)


def _timed_round(store, bus, cfg, queues, logs, timeout_s: float) -> RoundData:
    """Start the round (after its stage's difficulty filter, when ``start_round`` returns
    that first) and time it: from the call of ``start_round`` (its store writes and
    publishes are part of the round; the benchmark is loaded before, as the API holds it)
    to the round's ``finished_at`` (stamped by the trainer that marks it ``done``; this
    loop's 50 ms poll only finds out). ``rollout_s``: until the poll saw every rollout
    completed; ``start_s``: ``start_round`` itself; ``load_1m_at_start``: the 1-minute load
    average when the round starts (after the services' start-up, which it still reflects)."""
    from mgrpo.envs import load_benchmark
    from mgrpo.services.rounds import start_round

    bench = load_benchmark(cfg.bench_dir)  # the API holds it loaded (embedded: stage_pool)
    load_1m = os.getloadavg()[0]  # after start-up: the load the round itself starts in
    started_at = time.time()
    record = start_round(store, bus, cfg, queues, bench=bench)
    if record.index < 0:  # the curriculum filter round: wait, then start the real one
        wait_round(store, record.round_id, timeout_s, logs)
        started_at = time.time()
        record = start_round(store, bus, cfg, queues, bench=bench)
    start_s = time.time() - started_at
    rollout_done = None
    deadline = time.monotonic() + timeout_s
    while True:
        if rollout_done is None and store.round_progress(record.round_id).done:
            rollout_done = time.time()
        done = store.get_round(record.round_id)
        if done.status == "done":
            break
        if done.status in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"round {record.round_id} ended {done.status!r}:\n{logs()}")
        time.sleep(0.05)
    finished = done.finished_at
    if finished.tzinfo is None:  # SQLite gives the stored UTC time back naive
        finished = finished.replace(tzinfo=UTC)
    ended = finished.timestamp()
    rollout_done = min(rollout_done or ended, ended)
    return RoundData({}, {}, {}, {}, {}, wall_s=ended - started_at,
                     split={"start_s": start_s, "rollout_s": rollout_done - started_at,
                            "train_s": ended - rollout_done, "started_at_unix": started_at,
                            "load_1m_at_start": load_1m})


def worker_counts(procs: ServiceProcesses) -> dict[str, float]:
    """Episodes (planner workers) and calls (sub-agent workers) each process served."""
    import re

    import httpx

    gauges = {"planner-worker": "mgrpo_planner_episodes_done",
              "subagent-": "mgrpo_subagent_calls_done"}
    out = {}
    for name, port in procs.ports.items():
        gauge = next((g for p, g in gauges.items() if name.startswith(p)), None)
        if gauge is not None:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            out[name] = float(re.search(rf"^{gauge} (\S+)$", text, re.M).group(1))
    return out


def process_usage(procs: ServiceProcesses) -> dict[str, dict[str, float]]:
    """Each live service process's resident memory now and at its peak (``VmRSS``,
    ``VmHWM``, MB) and CPU seconds so far (user + system), from ``/proc`` (Linux); empty
    elsewhere."""
    out = {}
    for name, proc in procs.procs.items():
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited, or no /proc
            continue
        kb = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
              if line.startswith(("VmRSS:", "VmHWM:"))}
        ticks = os.sysconf("SC_CLK_TCK")
        out[name] = {"rss_mb": round(kb["VmRSS"] / 1024, 1),
                     "peak_rss_mb": round(kb["VmHWM"] / 1024, 1),
                     "cpu_s": (int(fields[11]) + int(fields[12])) / ticks}  # utime, stime
    return out


def _with_results(timed: RoundData, data: RoundData) -> RoundData:
    data.wall_s, data.split = timed.wall_s, timed.split
    return data


def delete_queues(broker_url: str, prefix: str, procs: ServiceProcesses, cfg) -> None:
    """Work queues of this prefix and the planner worker's reply queue (durable: they would
    otherwise outlive the run; its name is ``planner.replies.<host>-<pid>``)."""
    from kombu import Connection

    from mgrpo.bus.names import PLANNER_REPLY_QUEUE
    from mgrpo.services.context import Queues

    queues = Queues(prefix)
    names = [queues.episodes, queues.dead_letter, *(queues.trainer(m) for m in cfg.models),
             *(queues.subagent(r) for r in cfg.agents if r != "planner")]
    for name, worker in procs.procs.items():  # every planner-worker replica has its own
        if not name.startswith("planner-worker"):
            continue
        host = f"{socket.gethostname()}-{worker.pid}".lower()
        host = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)[:40]
        names.append(f"{prefix}{PLANNER_REPLY_QUEUE}.{host}")
    with Connection(broker_url) as connection:
        channel = connection.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except Exception:  # never declared or already gone: nothing to clean
                channel = connection.channel()
