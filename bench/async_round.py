"""Samples/s of the asynchronous mode against synchronous rounds, same work (embedded or
through the services).

The work is ``bench/round.py``'s: its warm-started tiny models (planner and searcher SFT'd
on expert demonstrations, so the planner delegates and rewards vary; an untrained coder),
its run config (B queries x K rollouts, the same seeds), here for ``--rounds`` consecutive
rounds. Both modes train with ``loss.rollout_is: token`` (the asynchronous mode needs it),
so they do the same arithmetic per round:

- **sync**: ``run_round`` after ``run_round`` (generation waits for training and back);
- **async**: ``mgrpo.training.pipeline.run_pipelined`` with ``max_staleness: N`` (round
  n+1 is sampled on a copy of the weights while round n trains, in a second thread).

Timed: the rounds only (model loading apart). Modes alternate (sync, async, async, sync,
...) within one run on one machine; ``os.getloadavg()`` is recorded before and after each
measurement. samples/s = trajectories trained (every model's, every round) / wall seconds;
episodes/s = B*K*rounds / wall.

``--learn R``: also train R rounds each way through ``run_training`` and report held-out
accuracy before/after (``eval_questions`` test questions) and the planner's training reward
per round (first third vs last third): does it still learn? Small models, few rounds: read
it as a smoke check, not a comparison of algorithms.

``--distributed``: the same through the services, each its own process (planner worker,
sub-agent workers, a trainer per model) on the local RabbitMQ and a fresh PostgreSQL
database: sync starts round r + 1 when round r is ``done``; async starts it as soon as
``start_round`` (what ``POST /v1/rounds`` calls) admits it.

``--hidden H --layers L``: untrained models of that size instead of the bench's warm-started
ones (more arithmetic per Python op; they never delegate, so only planner samples train).

What it does NOT do: tell how the overlap scales with larger models or GPUs (tiny models:
Python overhead dominates; embedded, both threads also share the GIL).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/async_round.py [--b 6] [--k 4] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from round import make_config, prepare_cached  # noqa: E402  (bench/round.py)

RESULT_FILE = Path(__file__).resolve().parent / "results" / "async_round.json"


def larger_models(paths, root: Path, hidden: int, layers: int) -> dict:
    """``paths`` with every model replaced by one untrained model of ``hidden`` x ``layers``
    (the cached tokenizer): more arithmetic per Python op. Untrained, it never delegates:
    only planner trajectories are trained."""
    from mgrpo.models import TinyModelConfig, load_tokenizer
    from mgrpo.models.tiny import build_tiny_model

    tokenizer = load_tokenizer(paths["init"])
    config = TinyModelConfig(hidden_size=hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=3 * hidden)
    model = build_tiny_model(config, len(tokenizer), tokenizer.pad_token_id,
                             tokenizer.eos_token_id)
    folder = root / f"model-{hidden}x{layers}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {**paths, **{m: folder for m in ("planner", "searcher", "coder")}}


def bench_config(paths, out_dir: Path, *, b: int, k: int, rounds: int, staleness: int,
                 eval_questions: int = 4):
    from mgrpo.training.config import RunConfig

    base = make_config(paths, out_dir, b=b, k=k, name="async-bench").model_dump(mode="json")
    base["stages"] = [{"stage": 1, "rounds": rounds}]
    base["loss"]["rollout_is"] = "token"
    base["max_staleness"] = staleness
    base["eval_questions"] = eval_questions
    return RunConfig.model_validate(base)


def timed_run(cfg, pipelined: bool) -> dict:
    """Train ``cfg``'s rounds (sync loop or pipeline); wall time of the rounds only."""
    from mgrpo.store import Store
    from mgrpo.training.loop import run_round, stage_pool, stage_schedule
    from mgrpo.training.pipeline import run_pipelined
    from mgrpo.training.system import build_system

    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    schedule = stage_schedule(cfg)
    load_before = os.getloadavg()
    started = time.perf_counter()
    if pipelined:
        run_pipelined(system, store, cfg.name, schedule)
    else:
        pool = stage_pool(system, 0, cfg.name)
        for _, r in schedule:
            run_round(system, store, cfg.name, r, pool)
    wall = time.perf_counter() - started
    rounds = store.list_rounds(cfg.name)
    trajs = sum(len(store.round_trajectories(r.round_id, m))
                for r in rounds for m in cfg.trained_models())
    metrics = store.metrics(cfg.name)
    stale = max((v.get(f"{m}/staleness_max", 0.0) for v in metrics.values()
                 for m in cfg.trained_models()), default=0.0)
    split = {key: sum(v.get(f"time/{key}", 0.0) for v in metrics.values())
             for key in ("rollout_s", "ingest_s", "update_s", "weight_sync_s")}
    store.close()
    episodes = len(schedule) * cfg.queries_per_round * cfg.k
    return {"wall_s": wall, "trajectories": trajs, "episodes": episodes,
            "samples_per_s": trajs / wall, "episodes_per_s": episodes / wall,
            "staleness_max": stale, "split_s": split,
            # sync: what overlapping generation with the rest could give at most, with a
            # core free for each: (generation + rest) / max(generation, rest)
            "overlap_bound": (split["rollout_s"] + (rest := sum(split.values())
                                                   - split["rollout_s"]))
            / max(split["rollout_s"], rest, 1e-9),
            "load_before": list(load_before),
            "load_after": list(os.getloadavg())}


def distributed_runs(paths, root: Path, args) -> list[dict]:
    """The same comparison through the services (each its own process, the local RabbitMQ,
    a fresh PostgreSQL database): one deployment, a run per measurement. sync: start a
    round, wait until ``done``, start the next; async: start each round as soon as
    ``start_round`` admits it (``RoundConflict`` otherwise: retried every 50 ms), then wait
    for the last. Timed from the first start to the last ``done``."""
    import yaml
    from round_services import delete_queues, start_services

    from mgrpo.bus.kombu_bus import KombuBus
    from mgrpo.services.context import Queues
    from mgrpo.services.launcher import ServiceProcesses
    from mgrpo.services.rounds import RoundConflict, cancel_round, start_round
    from mgrpo.store import Store
    from mgrpo.store.admin import temporary_database

    base = bench_config(paths, root / "dist", b=args.b, k=args.k, rounds=args.rounds,
                        staleness=0)
    (root / "dist").mkdir(parents=True, exist_ok=True)
    config_file = root / "dist" / "run.yaml"
    config_file.write_text(yaml.safe_dump(base.model_dump(mode="json"), sort_keys=False))
    prefix = f"a{os.getpid()}x{int(time.time())}."
    rows = []
    with temporary_database(args.postgres_url) as url:
        store = Store(url)
        store.upgrade()
        env = {**os.environ, "MGRPO_MODE": "distributed", "MGRPO_DATABASE_URL": url,
               "MGRPO_BROKER_URL": args.broker_url, "MGRPO_RUN_CONFIG": str(config_file),
               "MGRPO_QUEUE_PREFIX": prefix, "MGRPO_CHECKPOINT_URI": str(root / "ckpt"),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("MGRPO_ENGINE", None)
        procs = ServiceProcesses(env, root / "dist")
        queues = Queues(prefix)
        bus = KombuBus(args.broker_url, store, dead_letter_queue_name=queues.dead_letter)
        try:
            startup = start_services(procs, base)
            for rep in range(args.repeats):
                order = [("sync", 0), ("async", args.staleness)]
                for mode, n in (order if rep % 2 == 0 else order[::-1]):
                    data = {**base.model_dump(mode="json"), "name": f"{mode}-{rep}",
                            "max_staleness": n}
                    cfg = type(base).model_validate(data)
                    load_before = os.getloadavg()
                    started = time.perf_counter()
                    records, overlapped = [], 0
                    try:
                        while len(records) < args.rounds:
                            if mode == "sync" and records:
                                _wait_done(store, records[-1].round_id)
                            try:
                                record = start_round(store, bus, cfg, queues)
                            except RoundConflict:
                                time.sleep(0.05)
                                continue
                            overlapped += bool(records) and \
                                store.get_round(records[-1].round_id).status != "done"
                            records.append(record)
                        for record in records:
                            _wait_done(store, record.round_id)
                    except RuntimeError as error:  # a stuck round: cancel, say so, go on
                        for record in records:
                            cancel_round(store, record.round_id)
                        rows.append({"mode": mode, "repeat": rep, "error": str(error)})
                        print(json.dumps(rows[-1]), flush=True)
                        continue
                    wall = time.perf_counter() - started
                    trajs = sum(store.count_trajectories(r.round_id) for r in records)
                    row = {"mode": mode, "max_staleness": n, "repeat": rep, "wall_s": wall,
                           "trajectories": trajs, "samples_per_s": trajs / wall,
                           "rounds_started_before_previous_done": overlapped,
                           "load_before": list(load_before),
                           "load_after": list(os.getloadavg())}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            rows.append({"startup_s": startup})
        finally:
            procs.stop_all()
            bus.close()
            delete_queues(args.broker_url, prefix, procs, base)
            store.close()
    return rows


def _wait_done(store, round_id: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (status := store.get_round(round_id).status) != "done":
        if status in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"round {round_id} ended {status!r}")
        time.sleep(0.05)


def learn(paths, root: Path, *, b: int, k: int, rounds: int, staleness: int,
          eval_questions: int) -> dict:
    from mgrpo.store import Store
    from mgrpo.training.loop import run_training

    out = {}
    for label, n in (("sync", 0), (f"async_n{staleness}", staleness)):
        cfg = bench_config(paths, root / f"learn-{label}", b=b, k=k, rounds=rounds,
                           staleness=n, eval_questions=eval_questions)
        result = run_training(cfg, progress=False)
        store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
        per_round = list(store.metrics(cfg.name).values())
        store.close()
        third = max(len(per_round) // 3, 1)

        def mean(key: str, rows: list) -> float:
            return sum(r.get(key, 0.0) for r in rows) / max(len(rows), 1)

        out[label] = {
            "planner_reward_first_third": mean("planner/reward_mean", per_round[:third]),
            "planner_reward_last_third": mean("planner/reward_mean", per_round[-third:]),
            "planner_reward": [r.get("planner/reward_mean") for r in per_round],
            "format_valid": [r.get("planner/format_valid") for r in per_round],
            "accuracy": [r.get("planner/accuracy") for r in per_round],
            "before": result.before.get("eval/greedy/accuracy"),
            "after": result.after.get("eval/greedy/accuracy"),
            "before_sampled": result.before.get("eval/sampled/accuracy"),
            "after_sampled": result.after.get("eval/sampled/accuracy"),
            "wall_s": result.wall_s, "load_after": list(os.getloadavg())}
    return out


def main(argv: list[str] | None = None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--b", type=int, default=6)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="pairs (sync, async)")
    parser.add_argument("--sft-steps", type=int, default=150,
                        help="bench/round.py's warm start (150: the planner delegates)")
    parser.add_argument("--distributed", action="store_true",
                        help="through the services instead of embedded")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "MGRPO_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--broker-url", default=os.environ.get(
        "MGRPO_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--learn", type=int, default=0, help="rounds of the accuracy check")
    parser.add_argument("--eval-questions", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=0,
                        help="> 0: untrained models of this width instead of the bench's")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    paths = prepare_cached(sft_steps=args.sft_steps)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mgrpo-async-bench-") as tmp:
        root = Path(tmp)
        if args.hidden:
            paths = larger_models(paths, root, args.hidden, args.layers)
        for rep in range(0 if args.distributed else args.repeats):
            order = [("sync", 0), ("async", args.staleness)]
            for mode, n in (order if rep % 2 == 0 else order[::-1]):
                cfg = bench_config(paths, root / f"{mode}-{rep}", b=args.b, k=args.k,
                                   rounds=args.rounds, staleness=n)
                row = {"mode": mode, "max_staleness": n, "repeat": rep,
                       **timed_run(cfg, pipelined=mode == "async")}
                print(json.dumps(row), flush=True)
                rows.append(row)
        if args.distributed:
            rows = distributed_runs(paths, root, args)
        accuracy = learn(paths, root, b=args.b, k=args.k, rounds=args.learn,
                         staleness=args.staleness, eval_questions=args.eval_questions) \
            if args.learn else None

    extra = [r for r in rows if "mode" not in r]
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "mode" in r and "error" not in r]

    def median(mode: str) -> float:
        values = sorted(r["samples_per_s"] for r in rows if r["mode"] == mode)
        return values[len(values) // 2] if len(values) % 2 else \
            (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2

    result = {
        "bench": "async_round", "where": "distributed" if args.distributed else "embedded",
        **(extra[0] if extra else {}), "b": args.b, "k": args.k, "rounds": args.rounds,
        "max_staleness": args.staleness, "sft_steps": args.sft_steps,
        "model": f"untrained {args.hidden}x{args.layers}" if args.hidden
        else "bench/round.py's (hidden 64 x 2 layers)", "rows": rows,
        "samples_per_s": {"sync": median("sync"), "async": median("async")},
        "speedup": median("async") / median("sync"),
        # each repeat's pair was measured back to back: less exposed to load drift
        "paired_speedups": sorted(
            pair["async"] / pair["sync"] for i in range(args.repeats)
            if len(pair := {r["mode"]: r["samples_per_s"] for r in rows
                            if r["repeat"] == i}) == 2),
        "failed": failed,
        "accuracy": accuracy, "host": socket.gethostname(), "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "argv": sys.argv[1:] if argv is None else argv,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("samples_per_s", "speedup", "paired_speedups")}))
    return result


if __name__ == "__main__":
    main()
