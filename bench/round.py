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
(:func:`read_round`, :func:`compare_rounds`).

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


def prepare(root: Path, sft_steps: int = 60) -> dict[str, Path]:
    """Benchmark, demonstrations, a tiny init model, and SFT'd planner and searcher."""
    import torch

    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.envs.demos import write_demos
    from mgrpo.envs.experts import ExpertErrors
    from mgrpo.models import TinyModelConfig, init_tiny, load_model
    from mgrpo.models.sft import SFTConfig, load_sft_jsonl, train_sft
    from mgrpo.training.system import build_tools

    bench = build_benchmark(BenchmarkConfig(seed=0, n_train=120, n_dev=40, n_test=40,
                                            entities=SMALL))
    bench.save(root / "bench")
    tools = build_tools(bench, ["searcher", "coder"], tool_cfg={"search": {"k": 1}})
    write_demos(bench, root / "demos", tools, ExpertErrors.parse("planner.skip_delegation=0.5"),
                n=200, stage=1, seed=0)
    texts = [d.text for d in bench.corpus.docs] + [
        "".join(s.text for s in e.segments)
        for role in ("planner", "searcher") for e in load_sft_jsonl(root / f"demos/{role}.jsonl")]
    config = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=128, vocab_size=600)
    init_tiny(root / "init", config, corpus_texts=texts)
    paths = {"bench": root / "bench", "coder": root / "init"}
    for role in ("planner", "searcher"):
        model, tokenizer = load_model(root / "init")
        torch.manual_seed(0)
        train_sft(model, tokenizer, load_sft_jsonl(root / f"demos/{role}.jsonl"),
                  SFTConfig(steps=sft_steps, batch_size=16, lr=3e-3, eval_every=sft_steps,
                            seed=0))
        model.save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
        paths[role] = root / role
    return paths


def make_config(paths: dict[str, Path], out_dir: Path, *, b: int, k: int, seed: int = 3,
                name: str = "parity", temperature: float = 1.0):
    """The run config both modes share. ``name`` is the run id: round ids, hence every
    episode seed, derive from it, so both modes must use the same one. A ``temperature``
    above 1 flattens the warm-started (peaked) policies, so that a seeding difference
    between the modes shows up as different tokens (the parity test uses 1.5)."""
    from mgrpo.training.config import RunConfig

    return RunConfig.model_validate({
        "name": name, "seed": seed, "algorithm": "mgrpo",
        "agents": {"planner": "planner", "searcher": "searcher", "coder": "coder"},
        "models": {m: {"path": str(paths[m]), "lr": 1e-3, "micro_batch_size": 8}
                   for m in MODELS},
        "k": k, "queries_per_round": b, "tools": {"search": {"k": 1}},
        "sampling": {"planner_max_turns": 3, "subagent_max_turns": 2, "max_new_tokens": 24,
                     "temperature": temperature},
        "stages": [{"stage": 1, "rounds": 1}], "eval_questions": 4,
        "bench_dir": str(paths["bench"]), "out_dir": str(out_dir)})


def read_round(store, run_id: str, round_id: str, ckpt_root: str) -> RoundData:
    """Outcomes, group statistics (n = 0 placeholder rows left out: see the parity test),
    metrics, token ids and v1 weights of a finished round."""
    from mgrpo.models.checkpoint import load_checkpoint

    outcomes = {(o.query_id, o.rollout): (o.format_ok, o.correct, o.reward)
                for o in store.read_planner_outcomes(round_id)}
    stats = {(s.model, s.agent, s.group_key): (s.n, s.mean, s.std)
             for s in store.read_group_stats(round_id) if s.n > 0}
    tokens = {t.traj_id: list(t.input_ids)
              for m in MODELS for t in store.round_trajectories(round_id, m)}
    weights = {m: load_checkpoint(ckpt_root, m, version=1)[0] for m in MODELS}
    metrics = store.metrics(run_id, round_id).get(round_id, {})
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
    data = read_round(store, cfg.name, f"{cfg.name}-r0000", str(Path(cfg.out_dir) / "checkpoints"))
    data.wall_s = wall
    data.split = {key.removeprefix("time/"): value for key, value in metrics.items()
                  if key.startswith("time/")}
    store.close()
    return data


def start_services(procs: ServiceProcesses) -> float:
    """The six services of a co-training round; returns seconds until all are healthy."""
    started = time.perf_counter()
    procs.start("subagent-searcher", "serve", "subagent", "--name", "searcher",
                "--tool", "search")
    procs.start("subagent-coder", "serve", "subagent", "--name", "coder", "--tool", "python")
    procs.start("planner-worker", "serve", "planner-worker")
    for model in MODELS:
        procs.start(f"trainer-{model}", "serve", "trainer", "--model", model)
    procs.wait_healthy()
    return time.perf_counter() - started


def distributed_round(cfg, postgres_url: str, broker_url: str, workdir: Path,
                      timeout_s: float = 600.0) -> RoundData:
    """One round through separate service processes, on a fresh database and queue prefix."""
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
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("MGRPO_ENGINE", None)  # real tiny models, not a scripted policy
        procs = ServiceProcesses(env, workdir)
        bus = KombuBus(broker_url, store, dead_letter_queue_name=Queues(prefix).dead_letter)
        try:
            startup = start_services(procs)
            data = _timed_round(store, bus, cfg, Queues(prefix), procs, timeout_s)
            data.split["startup_s"] = startup
            data = _with_results(data, read_round(store, cfg.name, f"{cfg.name}-r0000",
                                                  str(workdir / "ckpt")))
        finally:
            procs.stop_all()
            bus.close()
            _delete_queues(broker_url, prefix, procs)
            store.close()
    return data


def _timed_round(store, bus, cfg, queues, procs: ServiceProcesses,
                 timeout_s: float) -> RoundData:
    from mgrpo.services.rounds import start_round

    started = time.perf_counter()
    record = start_round(store, bus, cfg, queues)
    rollout_done = None
    deadline = time.monotonic() + timeout_s
    while True:
        if rollout_done is None and store.round_progress(record.round_id).done:
            rollout_done = time.perf_counter()
        status = store.get_round(record.round_id).status
        if status == "done":
            break
        if status in ("failed", "cancelled") or time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{procs.log(n)[-1500:]}" for n in procs.procs)
            raise RuntimeError(f"round {record.round_id} ended {status!r}:\n{logs}")
        time.sleep(0.05)
    ended = time.perf_counter()
    rollout_done = rollout_done or ended
    return RoundData({}, {}, {}, {}, {}, wall_s=ended - started,
                     split={"rollout_s": rollout_done - started, "train_s": ended - rollout_done})


def _with_results(timed: RoundData, data: RoundData) -> RoundData:
    data.wall_s, data.split = timed.wall_s, timed.split
    return data


def _delete_queues(broker_url: str, prefix: str, procs: ServiceProcesses) -> None:
    """Work queues of this prefix and the planner worker's reply queue (durable: they would
    otherwise outlive the run; its name is ``planner.replies.<host>-<pid>``)."""
    from kombu import Connection

    from mgrpo.bus.names import PLANNER_REPLY_QUEUE
    from mgrpo.services.context import Queues

    queues = Queues(prefix)
    names = [queues.episodes, queues.dead_letter, *(queues.trainer(m) for m in MODELS),
             queues.subagent("searcher"), queues.subagent("coder")]
    worker = procs.procs.get("planner-worker")
    if worker is not None:
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
                      for m in MODELS for p in a.weights[m])
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
        "weight_tensors": float(sum(len(a.weights[m]) for m in MODELS)),
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
        paths = prepare(root / "assets")
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
