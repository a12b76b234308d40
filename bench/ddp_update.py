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

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT_FILE = Path(__file__).resolve().parent / "results" / "ddp_update.json"


def make_inputs(root: Path, n_samples: int, length: int) -> tuple[Path, Path]:
    from mgrpo.models import TinyModelConfig, init_tiny

    model = Path(init_tiny(root / "tiny", TinyModelConfig(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, vocab_size=400)))
    rng = random.Random(0)
    rows = []
    for i in range(n_samples):
        prompt = length // 2
        rows.append({"trajectory": {
            "traj_id": f"t{i}", "round_id": "r", "query_id": f"q{i // 4}", "rollout": i % 4,
            "agent": "planner", "model": "planner",
            "input_ids": [rng.randint(5, 399) for _ in range(length)],
            "response_mask": [0] * prompt + [1] * (length - prompt),
            "old_logprobs": [0.0] * prompt + [-6.0] * (length - prompt)},
            "advantage": rng.uniform(-1.5, 1.5), "reward": 0.0})
    samples = root / "samples.json"
    samples.write_text(json.dumps(rows))
    return model, samples


def run(ranks: int, model: Path, samples: Path, out: Path, micro: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", "-m", "mgrpo.training.distributed",
               "--model", str(model), "--samples", str(samples), "--out", str(out),
               "--name", "planner", "--micro-batch-size", str(micro)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("{")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULT_FILE))
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], 2: []}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, samples = make_inputs(root, args.samples, args.length)
        for i in range(args.repeats):
            for ranks in (1, 2):
                result = run(ranks, model, samples, root / f"ck{ranks}-{i}",
                             args.micro_batch_size)
                times[ranks].append(result["update_s"])
                loads.append(os.getloadavg()[0])
    median = {r: statistics.median(t) for r, t in times.items()}
    result = {
        "samples": args.samples, "length": args.length,
        "micro_batch_size": args.micro_batch_size, "repeats": args.repeats,
        "update_s": {str(r): [round(x, 3) for x in t] for r, t in times.items()},
        "median_update_s": {str(r): round(m, 3) for r, m in median.items()},
        "speedup_2_over_1": round(median[1] / median[2], 3),
        "machine": {"cpu_count": os.cpu_count(), "load_avg_1m": [round(x, 1) for x in loads]},
    }
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
