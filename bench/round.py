"""One training round's wall time: embedded vs distributed, on the same work.

The same run config (B queries x K rollouts, the same seeds), the same tiny models (a planner
and a searcher briefly warm-started by SFT on expert demonstrations so rewards vary; an
untrained coder), one M-GRPO co-training round two ways:

- **embedded**: ``mgrpo.training.loop.run_round`` in this process (SQLite store, models
  shared by sampler and trainer, weight sync = a local checkpoint);
- **distributed**: every service its own process (``mgrpo serve ...``: a planner worker, a
  searcher and a coder sub-agent, three trainers) on the local RabbitMQ and a fresh
  PostgreSQL database; the round is started with ``start_round`` (what ``POST /v1/rounds``
  calls) and ends when every trainer has published.

Timed: the round only (embedded: ``run_round``; distributed: ``start_round`` until status
``done``). Process start-up and model loading are reported apart (``startup_s``). Split:
embedded from the round's own metrics (rollout / ingest / update / weight sync);
distributed ``rollout_s`` = until every rollout is completed (trajectories stream to the
trainers meanwhile), ``train_s`` = the rest (ingest tail, readiness, update, checkpoint,
publish), read by polling the store every 50 ms.

The functions are also the harness of ``tests/integration/services/test_services_parity.py``
and ``test_services_algorithms.py``: :func:`make_config` variants (co-training, main-only,
grpo, curriculum), :func:`inprocess_round` (the same service classes in one process, on the
in-memory bus), :func:`read_round`, :func:`compare_rounds`, and :func:`prepare_cached` (the
warm-started models built once per machine and code version, on disk).

What it does NOT do: measure throughput at scale (tiny models on a shared 2-core machine:
process and broker overheads dominate), or run more than one round.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/round.py [--b 6] [--k 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mgrpo.services.launcher import ServiceProcesses
from mgrpo.tools import ROLE_TOOLS

SMALL = {"train": {"city": 12, "person": 16, "company": 8},
         "dev": {"city": 6, "person": 8, "company": 4},
         "test": {"city": 6, "person": 8, "company": 4}}
MODELS = ("planner", "searcher", "coder")
RESULT_FILE = Path(__file__).resolve().parent / "results" / "round.json"


@dataclass
class RoundData:
    """What one round left in its store and checkpoints, keyed for comparison."""

    outcomes: dict[tuple[str, int], tuple[bool, float, float]]  # (q, k) -> (format, correct, R)
    stats: dict[tuple[str, str, str], tuple[int, float, float]]  # (model, agent, key) -> n,mu,sd
    metrics: dict[str, float]
    tokens: dict[str, list[int]]  # traj_id -> input_ids, every model
    weights: dict[str, dict]  # model -> state dict of checkpoint v1
    wall_s: float = 0.0
    split: dict[str, float] = field(default_factory=dict)
    work: dict[str, float] = field(default_factory=dict)  # worker process -> episodes/calls


ASSET_MODULES = ("envs/benchmark.py", "envs/demos.py", "envs/experts.py", "models/sft.py",
                 "models/tiny.py", "training/inline.py")  # what the assets are made by
ASSET_NAMES = ("bench", "init", "planner", "searcher", "single")


def asset_key(sft_steps: int) -> str:
    """Cache key of :func:`prepare`: its settings and the source of the code that makes the
    assets (a change there builds new ones instead of reusing stale files)."""
    import hashlib

    import mgrpo

    digest = hashlib.sha256(f"v1|sft_steps={sft_steps}|{SMALL}".encode())
    package = Path(mgrpo.__file__).resolve().parent
    for module in ASSET_MODULES:
        digest.update((package / module).read_bytes())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    """``MGRPO_ASSET_CACHE``, else ``~/.cache/mgrpo/assets``."""
    return Path(os.environ.get("MGRPO_ASSET_CACHE")
                or Path.home() / ".cache" / "mgrpo" / "assets")


def prepare_cached(sft_steps: int = 60, cache_dir: Path | None = None) -> dict[str, Path]:
    """:func:`prepare`, built once per (settings, code) and kept on disk: tests and repeated
    benchmark runs load the same warm-started models instead of re-running SFT. Built in a
    temporary folder and renamed into place, so concurrent callers never see half an entry
    (the loser of a race discards its copy). Callers must not write into the returned
    folders (both modes write checkpoints elsewhere)."""
    import shutil

    root = (cache_dir or default_cache_dir()) / asset_key(sft_steps)
    if not (root / "complete").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            prepare(tmp, sft_steps=sft_steps)
            (tmp / "complete").write_text("ok\n")
            os.replace(tmp, root)
        except OSError:
            if not (root / "complete").exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"coder": root / "init", **{name: root / name for name in ASSET_NAMES}}


def prepare(root: Path, sft_steps: int = 60) -> dict[str, Path]:
    """Benchmark, demonstrations, a tiny init model, SFT'd planner and searcher, and a
    single-agent model (``single``: SFT'd on the inline form of the same demonstrations, for
    ``algorithm: grpo``, with the planner's and the searcher's steps together)."""
    import torch

    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.envs.demos import write_demos
    from mgrpo.envs.experts import ExpertErrors
    from mgrpo.models import TinyModelConfig, init_tiny, load_model
    from mgrpo.models.sft import SFTConfig, load_sft_jsonl, train_sft
    from mgrpo.training.inline import write_inline_demos
    from mgrpo.training.system import build_tools

    bench = build_benchmark(BenchmarkConfig(seed=0, n_train=120, n_dev=40, n_test=40,
                                            entities=SMALL))
    bench.save(root / "bench")
    tools = build_tools(bench, ["searcher", "coder"], tool_cfg={"search": {"k": 1}})
    errors = ExpertErrors.parse("planner.skip_delegation=0.5")
    write_demos(bench, root / "demos", tools, errors, n=200, stage=1, seed=0)
    write_inline_demos(bench, root / "demos-inline", tools, errors, n=200, stage=1, seed=0)
    texts = [d.text for d in bench.corpus.docs] + [
        "".join(s.text for s in e.segments)
        for role in ("planner", "searcher") for e in load_sft_jsonl(root / f"demos/{role}.jsonl")]
    config = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=128, vocab_size=600)
    init_tiny(root / "init", config, corpus_texts=texts)
    paths = {"bench": root / "bench", "coder": root / "init", "init": root / "init"}
    for role, data, steps in (("planner", "demos/planner.jsonl", sft_steps),
                              ("searcher", "demos/searcher.jsonl", sft_steps),
                              ("single", "demos-inline/planner.jsonl", 2 * sft_steps)):
        model, tokenizer = load_model(root / "init")
        torch.manual_seed(0)
        train_sft(model, tokenizer, load_sft_jsonl(root / data),
                  SFTConfig(steps=steps, batch_size=16, lr=3e-3, eval_every=steps, seed=0))
        model.save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
        paths[role] = root / role
    return paths


VARIANTS = ("co-training", "main-only", "grpo", "curriculum")


def make_config(paths: dict[str, Path], out_dir: Path, *, b: int, k: int, seed: int = 3,
                name: str = "parity", temperature: float = 1.0, variant: str = "co-training"):
    """The run config both modes share. ``name`` is the run id: round ids, hence every
    episode seed, derive from it, so both modes must use the same one. A ``temperature``
    above 1 flattens the warm-started (peaked) policies, so that a seeding difference
    between the modes shows up as different tokens (the parity test uses 1.5).

    ``variant``: ``co-training`` (M-GRPO, every model trained), ``main-only`` (M-GRPO,
    sub-agents frozen), ``grpo`` (one model ``single`` plays every role) or ``curriculum``
    (co-training on the questions a difficulty filter keeps: ``max_success`` 0.5 over 2
    filter rollouts per question)."""
    from mgrpo.training.config import RunConfig

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    data = {
        "name": name, "seed": seed, "algorithm": "mgrpo",
        "agents": {"planner": "planner", "searcher": "searcher", "coder": "coder"},
        "models": {m: {"path": str(paths[m]), "lr": 1e-3, "micro_batch_size": 8}
                   for m in MODELS},
        "k": k, "queries_per_round": b, "tools": {"search": {"k": 1}},
        "sampling": {"planner_max_turns": 3, "subagent_max_turns": 2, "max_new_tokens": 24,
                     "temperature": temperature},
        "stages": [{"stage": 1, "rounds": 1}], "eval_questions": 4,
        "bench_dir": str(paths["bench"]), "out_dir": str(out_dir)}
    if variant == "main-only":
        for model in ("searcher", "coder"):
            data["models"][model]["trainable"] = False
    elif variant == "grpo":
        data.update(algorithm="grpo", agents=dict.fromkeys(MODELS, "single"),
                    models={"single": {"path": str(paths["single"]), "lr": 1e-3,
                                       "micro_batch_size": 8}})
    elif variant == "curriculum":
        data["stages"] = [{"stage": 1, "rounds": 1, "max_success": 0.5, "filter_samples": 2}]
    return RunConfig.model_validate(data)


def read_round(store, cfg, round_id: str, ckpt_root: str) -> RoundData:
    """Outcomes, group statistics (n = 0 placeholder rows left out: see the parity test),
    metrics, the trained models' token ids and v1 weights of a finished round of run
    ``cfg.name``. Frozen models are left out: no trainer ingests their trajectories in
    distributed mode, and they have no checkpoint."""
    from mgrpo.models.checkpoint import load_checkpoint, run_root

    trained = cfg.trained_models()
    outcomes = {(o.query_id, o.rollout): (o.format_ok, o.correct, o.reward)
                for o in store.read_planner_outcomes(round_id)}
    stats = {(s.model, s.agent, s.group_key): (s.n, s.mean, s.std)
             for s in store.read_group_stats(round_id) if s.n > 0 and s.model in trained}
    tokens = {t.traj_id: list(t.input_ids)
              for m in trained for t in store.round_trajectories(round_id, m)}
    weights = {m: load_checkpoint(run_root(ckpt_root, cfg.name), m, version=1)[0]
               for m in trained}
    metrics = store.metrics(cfg.name, round_id).get(round_id, {})
    return RoundData(outcomes, stats, metrics, tokens, weights)


def embedded_round(cfg) -> RoundData:
    """One round of ``run_round`` in this process, on a fresh SQLite store."""
    from mgrpo.store import Store
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.system import build_system

    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    started = time.perf_counter()
    metrics = run_round(system, store, cfg.name, 0, stage_pool(system, 0))
    wall = time.perf_counter() - started
    data = read_round(store, cfg, f"{cfg.name}-r0000", str(Path(cfg.out_dir) / "checkpoints"))
    data.wall_s = wall
    data.split = {key.removeprefix("time/"): value for key, value in metrics.items()
                  if key.startswith("time/")}
    store.close()
    return data


def service_argv(cfg, replicas: dict[str, int] | None = None) -> dict[str, list[str]]:
    """The services a round of ``cfg`` needs (name -> argv after ``mgrpo``): a sub-agent
    worker per sub-agent role (none for ``grpo``: the single agent plays them inline), the
    planner worker, and a trainer per model (a frozen model's trainer idles).

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
            tool = cfg.role_tools.get(role) or ROLE_TOOLS[role]
            out[f"subagent-{role}"] = ["serve", "subagent", "--name", role, "--tool", tool]
    out["planner-worker"] = ["serve", "planner-worker"]
    for model in dict.fromkeys(cfg.agents.values()):
        out[f"trainer-{model}"] = ["serve", "trainer", "--model", model]
    return out


def start_services(procs: ServiceProcesses, cfg, replicas: dict[str, int] | None = None) -> float:
    """Start :func:`service_argv`'s processes; returns seconds until all are healthy."""
    started = time.perf_counter()
    for name, argv in service_argv(cfg, replicas).items():
        procs.start(name, *argv)
    procs.wait_healthy()
    return time.perf_counter() - started


def distributed_round(cfg, postgres_url: str, broker_url: str, workdir: Path,
                      timeout_s: float = 600.0, replicas: dict[str, int] | None = None
                      ) -> RoundData:
    """One round through separate service processes, on a fresh database and queue prefix
    (``replicas``: see :func:`service_argv`). ``work`` of the result: the episodes or calls
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

            data = _timed_round(store, bus, cfg, Queues(prefix), logs, timeout_s)
            data.split["startup_s"] = startup
            data = _with_results(data, read_round(store, cfg, f"{cfg.name}-r0000",
                                                  str(workdir / "ckpt")))
            data.work = worker_counts(procs)
        finally:
            procs.stop_all()
            bus.close()
            _delete_queues(broker_url, prefix, procs, cfg)
            store.close()
    return data


def inprocess_round(cfg, workdir: Path, timeout_s: float = 600.0) -> RoundData:
    """The same services as :func:`distributed_round` (planner worker, sub-agent workers,
    trainers: the classes ``mgrpo serve`` runs), in THIS process on the in-memory bus and a
    SQLite store: the distributed code path without process start-up or a broker."""
    from mgrpo.bus import InMemoryBus
    from mgrpo.config import Settings
    from mgrpo.services.context import Queues, open_store
    from mgrpo.services.planner_worker import PlannerRuntime, PlannerWorker
    from mgrpo.services.subagent_worker import SubagentWorker
    from mgrpo.services.trainer import TrainerService

    workdir.mkdir(parents=True, exist_ok=True)
    settings = Settings(mode="embedded", database_url=f"sqlite:///{workdir / 'store.db'}",
                        checkpoint_uri=str(workdir / "ckpt"), engine="torch")
    store = open_store(settings)
    bus = InMemoryBus(store)
    trainers = []
    try:
        for argv in service_argv(cfg).values():
            if argv[1] == "subagent":
                SubagentWorker(settings, cfg, store, bus, argv[3], argv[5]).start()
            elif argv[1] == "trainer":
                trainers.append(TrainerService(settings, cfg, store, bus, argv[3], poll_s=0.1))
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
    that first) and time it until ``done``."""
    from mgrpo.services.rounds import start_round

    record = start_round(store, bus, cfg, queues)
    if record.index < 0:  # the curriculum filter round: wait, then start the real one
        wait_round(store, record.round_id, timeout_s, logs)
        record = start_round(store, bus, cfg, queues)
    started = time.perf_counter()
    rollout_done = None
    deadline = time.monotonic() + timeout_s
    while True:
        if rollout_done is None and store.round_progress(record.round_id).done:
            rollout_done = time.perf_counter()
        status = store.get_round(record.round_id).status
        if status == "done":
            break
        if status in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"round {record.round_id} ended {status!r}:\n{logs()}")
        time.sleep(0.05)
    ended = time.perf_counter()
    rollout_done = rollout_done or ended
    return RoundData({}, {}, {}, {}, {}, wall_s=ended - started,
                     split={"rollout_s": rollout_done - started, "train_s": ended - rollout_done})


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


def _with_results(timed: RoundData, data: RoundData) -> RoundData:
    data.wall_s, data.split = timed.wall_s, timed.split
    return data


def _delete_queues(broker_url: str, prefix: str, procs: ServiceProcesses, cfg) -> None:
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


def compare_rounds(a: RoundData, b: RoundData) -> dict[str, float]:
    """Largest differences between two rounds (0 everywhere = identical). Count mismatches
    are reported as counts of keys present in only one round."""
    def max_diff(x: dict, y: dict, key_fn) -> float:
        common = x.keys() & y.keys()
        return max((key_fn(x[k], y[k]) for k in common), default=0.0)

    weight_diff = max(float((a.weights[m][p] - b.weights[m][p]).abs().max())
                      for m in a.weights for p in a.weights[m])
    metric_keys = {k for k in a.metrics.keys() & b.metrics.keys()
                   if not k.startswith(("time/", "throughput/"))}
    return {
        "outcome_keys_only_one_side": float(len(a.outcomes.keys() ^ b.outcomes.keys())),
        "outcome_mismatches": float(sum(a.outcomes[k] != b.outcomes[k]
                                        for k in a.outcomes.keys() & b.outcomes.keys())),
        "token_keys_only_one_side": float(len(a.tokens.keys() ^ b.tokens.keys())),
        "token_mismatches": float(sum(a.tokens[k] != b.tokens[k]
                                      for k in a.tokens.keys() & b.tokens.keys())),
        "stat_keys_only_one_side": float(len(a.stats.keys() ^ b.stats.keys())),
        "stat_max_abs_diff": max_diff(a.stats, b.stats, lambda u, v: max(
            abs(p - q) for p, q in zip(u, v, strict=True))),
        "metrics_compared": float(len(metric_keys)),
        "metric_max_abs_diff": max((abs(a.metrics[k] - b.metrics[k]) for k in metric_keys),
                                   default=0.0),
        "weight_max_abs_diff": weight_diff,
        "weight_tensors": float(sum(len(a.weights[m]) for m in a.weights)),
    }


def machine() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--b", type=int, default=6, help="queries per round (B)")
    parser.add_argument("--k", type=int, default=4, help="rollouts per query (K)")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "MGRPO_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--broker-url", default=os.environ.get(
        "MGRPO_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--out", default=str(RESULT_FILE))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = prepare(root / "assets")  # fresh models: a benchmark must not reuse a cache
        load_before = os.getloadavg()[0]
        emb = embedded_round(make_config(paths, root / "emb", b=args.b, k=args.k))
        dist = distributed_round(make_config(paths, root / "dist-out", b=args.b, k=args.k),
                                 args.postgres_url, args.broker_url, root / "dist")
        parity = compare_rounds(emb, dist)
    result = {
        "B": args.b, "K": args.k, "episodes": args.b * args.k,
        "embedded": {"wall_s": round(emb.wall_s, 3),
                     "split": {k: round(v, 3) for k, v in emb.split.items()}},
        "distributed": {"wall_s": round(dist.wall_s, 3),
                        "split": {k: round(v, 3) for k, v in dist.split.items()},
                        "processes": 6},
        "ratio_distributed_over_embedded": round(dist.wall_s / max(emb.wall_s, 1e-9), 3),
        "parity": parity, "machine": {**machine(), "load_avg_1m_before": round(load_before, 2)},
    }
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
