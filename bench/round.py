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

Timed: the round only (embedded: ``run_round``; distributed: from the call of
``start_round``, its publishes included, to the ``finished_at`` the last trainer stamps when
it marks the round ``done``). Process start-up and model loading are reported apart
(``startup_s``). Split: embedded from the round's own metrics (rollout / ingest / update /
weight sync); distributed ``start_s`` (``start_round``), ``rollout_s`` = until every rollout
is completed (trajectories stream to the trainers meanwhile; seen by polling the store every
50 ms), ``train_s`` = the rest (ingest tail, readiness, update, checkpoint, publish).

This file is the CLI and the timing; the harness lives in ``round_harness.py`` (config,
embedded round, comparison) and ``round_services.py`` (the round through the services), and
is re-exported here for ``tests/integration/services/test_services_parity.py`` and
``test_services_algorithms.py`` (loaded as ``bench_round``): :func:`make_config` variants
(co-training, main-only, grpo, curriculum, at_grpo), :func:`inprocess_round` (the same
service classes in one process, on the in-memory bus), :func:`distributed_round`,
:func:`read_round`, :func:`compare_rounds`, and :func:`prepare_cached` (the warm-started
models built once per machine and code version, on disk; ``mgrpo.experiments.tiny_assets``).

Repeats (``--repeats N``, default 3): N timed rounds per mode and size, the modes alternated
in ABBA pairs (embedded, distributed, distributed, embedded, ...; ``round_repeats.py``), each
a fresh round 0 of the same config (distributed: fresh processes, so every distributed round
is its processes' first, as in one-round runs), or with ``--warmup W`` a fresh system that
plays rounds 0..W-1 untimed and then the timed round W (distributed: the same processes; so
``--warmup 1`` times a service's second round, as the embedded process, which keeps torch
warm between repeats, already did); the JSON gives the per-round times, the
median per mode, the ratio of the medians and each pair's ratio, and the load average before
and after every round. Parity is checked on every pair.

Sizes (``--sizes``, default 6x4 and 6x16): 6x16 is the size "where compute dominates more":
the same models, four times the episodes (rollouts, tokens ingested and trained on) of 6x4,
while the per-round fixed costs (messages, readiness, checkpoint, publish) stay the same.

What it does NOT do: measure throughput at scale (tiny models on a shared 2-core machine:
process and broker overheads dominate).

The warm-started models come from :func:`mgrpo.experiments.tiny_assets.prepare_cached`
(``--sft-steps``, default 150: the planner then delegates; ``delegations`` in the JSON counts
the sub-agent trajectories of each round).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/round.py [--sizes 6x4 6x16] [--repeats 3]
        [--sft-steps 150] [--warmup 1]
        [--logs DIR]   # keep each size's service logs (per-phase timings) in DIR/BxK-i/
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

from round_harness import (  # noqa: E402,F401 - re-exported: the harness API of the tests
    MODELS,
    VARIANTS,
    RoundData,
    compare_rounds,
    delegations,
    embedded_round,
    make_config,
    read_round,
)
from round_repeats import mode_order, summarize  # noqa: E402
from round_services import (  # noqa: E402,F401 - re-exported
    distributed_round,
    inprocess_round,
    service_argv,
    start_services,
    wait_round,
)

from mgrpo.experiments.tiny_assets import prepare, prepare_cached  # noqa: E402,F401 - harness API

RESULT_FILE = Path(__file__).resolve().parent / "results" / "round.json"


def machine() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def measure(paths: dict[str, Path], root: Path, b: int, k: int, postgres_url: str,
            broker_url: str, logs: Path | None = None, repeats: int = 1,
            warmup: int = 0) -> dict:
    """One size: ``repeats`` embedded and ``repeats`` distributed rounds on the same config,
    alternated (:func:`round_repeats.mode_order`), each a fresh round 0 (embedded: a fresh
    system and SQLite store; distributed: fresh processes, database and queues), each with
    the load average before and after. Parity (every pair's two rounds) and delegations are
    checked on every pair; the JSON keeps the first pair's and the worst over all pairs."""
    runs: list[dict] = []
    data: dict[tuple[int, str], RoundData] = {}
    for i, mode in mode_order(repeats):
        tag = f"{b}x{k}-{i}"
        load_before = os.getloadavg()
        if mode == "embedded":
            cfg = make_config(paths, root / f"emb-{tag}", b=b, k=k)
            got = embedded_round(cfg, warmup=warmup)
        else:
            cfg = make_config(paths, root / f"dist-out-{tag}", b=b, k=k)
            got = distributed_round(cfg, postgres_url, broker_url, root / f"dist-{tag}",
                                    logs_to=logs / tag if logs else None, warmup=warmup)
        data[i, mode] = got
        runs.append({"pair": i, "mode": mode, "wall_s": round(got.wall_s, 3),
                     "split": {key: round(v, 3) for key, v in got.split.items()},
                     "delegations": delegations(got, cfg),
                     "load_avg_before": [round(x, 2) for x in load_before],
                     "load_avg_after": [round(x, 2) for x in os.getloadavg()]})
        print(json.dumps({"size": f"{b}x{k}", **runs[-1]}, sort_keys=True), flush=True)
    parities = [compare_rounds(data[i, "embedded"], data[i, "distributed"])
                for i in range(repeats)]
    summary = summarize({mode: [r["wall_s"] for r in runs if r["mode"] == mode]
                         for mode in ("embedded", "distributed")})
    return {
        "B": b, "K": k, "episodes": b * k, "repeats": repeats, "timed_round": warmup,
        **summary,
        "delegations": {r["mode"]: r["delegations"] for r in runs if r["pair"] == 0},
        "parity": parities[0],
        "parity_worst_over_pairs": {key: max(p[key] for p in parities) for key in parities[0]},
        "runs": runs,
        "load_avg_first_last": [runs[0]["load_avg_before"], runs[-1]["load_avg_after"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["6x4", "6x16"],
                        help="BxK round sizes, measured one after the other in this run")
    parser.add_argument("--sft-steps", type=int, default=150,
                        help="warm-start SFT steps of the planner and searcher (enough that "
                        "the planner delegates: see `delegations` in the JSON)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed rounds per mode and size, the modes alternated")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "MGRPO_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--broker-url", default=os.environ.get(
        "MGRPO_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--warmup", type=int, default=0,
                        help="rounds each mode's system plays before the timed one (the "
                        "same processes: 1 times a service's second round, not its first)")
    parser.add_argument("--out", default=str(RESULT_FILE))
    parser.add_argument("--logs", default=None,
                        help="copy each size's service logs (phase timings) to LOGS/BxK/")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes]
    paths = prepare_cached(args.sft_steps)  # keyed by settings and code: never stale
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for b, k in sizes:
            rows.append(measure(paths, Path(tmp), b, k, args.postgres_url, args.broker_url,
                                Path(args.logs) if args.logs else None, args.repeats,
                                args.warmup))
            print(json.dumps({key: rows[-1][key] for key in (
                "B", "K", "median_s", "ratio_of_medians", "pair_ratios")}), flush=True)
    result = {"sft_steps": args.sft_steps, "repeats": args.repeats, "warmup": args.warmup,
              "rounds": rows,
              "machine": machine()}
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
