"""A trainer's update time for 1 vs 2 ranks on the same work (CPU, gloo, DDP): one policy
update (``mgrpo.training.distributed`` under ``torchrun``) of a tiny model on the same
synthetic samples, each rank count run ``--repeats`` times; the figure is the slowest rank's
``policy_update`` time (process start-up, model loading and the checkpoint write excluded).

The machine's load (1-minute load average, CPU count) is recorded next to the figures: on a
shared machine a second rank competes with everything else for the same cores, so the ratio
says what gloo costs here, not what GPUs would do.

What it does NOT do: measure GPUs (none here), FSDP, or several nodes.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/ddp_update.py [--samples 48] [--repeats 3]
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from rank_timing import parse_args, time_setups, torchrun, write_result

RESULT_FILE = Path(__file__).resolve().parent / "results" / "ddp_update.json"


def run(ranks: int, model: Path, samples: Path, out: Path, micro: int) -> dict:
    proc = torchrun(ranks, "-m", "mgrpo.training.distributed",
                    "--model", str(model), "--samples", str(samples), "--out", str(out),
                    "--name", "planner", "--micro-batch-size", str(micro))
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("{")))


def main() -> None:
    args = parse_args(__doc__, repeats=3, out=RESULT_FILE, setups=("1", "2"))
    ranks = tuple(int(name) for name in args.setups)
    times, loads = time_setups(args, ranks, args.repeats, lambda ranks, model, samples, out:
                               run(ranks, model, samples, out, args.micro_batch_size)["update_s"])
    median = {r: statistics.median(t) for r, t in times.items()}
    result = {
        "samples": args.samples, "length": args.length,
        "micro_batch_size": args.micro_batch_size, "repeats": args.repeats,
        "update_s": {str(r): [round(x, 3) for x in t] for r, t in times.items()},
        "median_update_s": {str(r): round(m, 3) for r, m in median.items()},
        "speedup_2_over_1": round(median[1] / median[2], 3) if len(median) == 2 else None,
    }
    write_result(result, loads, args.out)


if __name__ == "__main__":
    main()
