"""How a distributed round grows with its size B x K: wall time, and each process's memory
and CPU.

The work is ``bench/round.py``'s (imported, not copied): its warm-started tiny models
(``--sft-steps``, default 150: the planner delegates), its run config (M-GRPO co-training:
a planner, a searcher and a coder, each trained) and its distributed round
(:func:`round_services.distributed_round`: every service its own process on the local
RabbitMQ and a fresh PostgreSQL database, started by ``start_round`` as ``POST /v1/rounds``
does, timed until the round is ``done``). One round per size (``--sizes``, default 4x4
8x8 16x16: 16, 64 and 256 episodes), each on fresh processes (``--warmup W``: the same
processes play W untimed rounds first).

``--stage 2`` plays stage-2 questions (chains, comparisons, arithmetic) on assets whose
demonstrations are of that stage (``prepare_cached(..., stage=2)``: the planner, the searcher
and the coder SFT'd): the planner delegates to both sub-agent types, so each type's CPU
seconds per call show. The default, stage 1 (look-ups), calls only the searcher.

Per size: the round's wall time and split (``start_s``, ``rollout_s``, ``train_s``), the
sub-agent trajectories per model (did the planner delegate, to which types?), the episodes
or calls each worker served, and per service process (``/proc``): its peak resident memory
over its life (``VmHWM``: loading included), its resident memory when the timed round
starts, and the CPU seconds it spent in the round. Then least-squares slopes over the
sizes: seconds per episode (is time linear in B x K?) and, per process, MB of peak memory
per episode (flat memory: about 0), and each sub-agent type's CPU seconds per call (what
each type costs). This process (the API's part: ``start_round``, then polling) is reported
too. The load average is recorded around every round: on a shared machine wall times move
with it, CPU seconds much less.

What it does NOT do: time the embedded mode (``bench/scaling.py``), repeat a size (one round
each: read single figures as such), or tell how larger models or GPUs scale.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/round_scaling.py [--sizes 4x4 8x8 16x16]
        [--sft-steps 150] [--warmup 0] [--stage 1|2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

from report import fit, load_avg, progress, write_result  # noqa: E402
from round import delegations, make_config, prepare_cached  # noqa: E402
from round_services import distributed_round  # noqa: E402

from mgrpo.experiments.tiny_assets import STAGES  # noqa: E402

RESULT_FILE = Path(__file__).resolve().parent / "results" / "round_scaling.json"


def one_size(paths, root: Path, b: int, k: int, args) -> dict:
    cfg = make_config(paths, root / f"out-{b}x{k}", b=b, k=k, name=f"scale{b}x{k}",
                      stage=args.stage)
    load_before = load_avg()
    data = distributed_round(cfg, args.postgres_url, args.broker_url, root / f"dist-{b}x{k}",
                             timeout_s=args.timeout_s, warmup=args.warmup)
    return {"B": b, "K": k, "episodes": b * k, "wall_s": round(data.wall_s, 3),
            "split": {key: round(v, 3) for key, v in data.split.items()},
            "trajectories": len(data.tokens), "delegations": delegations(data, cfg),
            "work": data.work, "processes": data.usage,
            "load_avg_before": load_before, "load_avg_after": load_avg()}


def summarize(rows: list[dict]) -> dict:
    """Slopes over the sizes: wall seconds per episode, each process's peak MB per episode
    (0: memory flat in B x K), and each sub-agent type's CPU seconds per call."""
    names = sorted(set.intersection(*(set(r["processes"]) for r in rows))) if rows else []
    per_call = {}
    for name in (n for n in names if n.startswith("subagent-")):
        calls = sum(r["work"].get(name, 0.0) for r in rows)
        per_call[name] = round(sum(r["processes"][name]["cpu_s"] for r in rows) / calls, 4) \
            if calls else None
    return {
        "wall_s_per_episode": fit([(r["episodes"], r["wall_s"]) for r in rows]),
        "rollout_s_per_episode": fit([(r["episodes"], r["split"]["rollout_s"]) for r in rows]),
        "train_s_per_episode": fit([(r["episodes"], r["split"]["train_s"]) for r in rows]),
        "peak_rss_mb_per_episode": {n: fit([(r["episodes"], r["processes"][n]["peak_rss_mb"])
                                            for r in rows]) for n in names},
        "cpu_s_per_episode": {n: fit([(r["episodes"], r["processes"][n]["cpu_s"])
                                      for r in rows]) for n in names},
        "subagent_cpu_s_per_call": per_call,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["4x4", "8x8", "16x16"],
                        help="BxK round sizes, smallest first")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--stage", type=int, choices=STAGES, default=1,
                        help="benchmark stage of the demonstrations and the round (2: the "
                        "planner delegates to the searcher and the coder)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="untimed rounds the same processes play before the timed one")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per round")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "MGRPO_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--broker-url", default=os.environ.get(
        "MGRPO_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes]
    paths = prepare_cached(args.sft_steps, stage=args.stage)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mgrpo-round-scaling-") as tmp:
        for b, k in sizes:
            rows.append(one_size(paths, Path(tmp), b, k, args))
            progress(rows[-1], ("B", "K", "wall_s", "delegations", "load_avg_after"))
    return write_result({"bench": "round_scaling", "sft_steps": args.sft_steps,
                         "stage": args.stage, "warmup": args.warmup, "rows": rows,
                         "slopes": summarize(rows)},
                        args.out, argv, rss_key="this_process_peak_rss_mb")


if __name__ == "__main__":
    main()
