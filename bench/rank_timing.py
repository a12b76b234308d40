"""What ``bench/trainer_ranks.py`` is built on: the tiny model and the synthetic samples it
updates on (written and read back), its options, the torchrun launch (one thread a rank),
the timing loop over its set-ups (1 and 2 ranks) with the machine's 1-minute load average
read before and after each launch, and the result file with the machine in it."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


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


def read_samples(path: str) -> list:
    """The samples :func:`make_inputs` wrote, as the trainer's update takes them."""
    from mgrpo.training.scoring import Sample
    from mgrpo.types import Trajectory

    rows = json.loads(Path(path).read_text())
    return [Sample(Trajectory.model_validate(r["trajectory"]), float(r["advantage"]),
                   float(r["reward"])) for r in rows]


def parse_args(doc: str, repeats: int, out: Path, setups: tuple[str, ...]) -> argparse.Namespace:
    """The shared options; ``--setups`` picks some of ``setups`` (names; default all)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", default=str(out))
    parser.add_argument("--setups", nargs="+", choices=setups, default=list(setups),
                        help="run only these (the ratios need all of them)")
    return parser.parse_args()


def torchrun(ranks: int, *argv: str) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node=RANKS ARGV...``, one thread a rank; raises
    if it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={ranks}", *argv], env=env, check=True,
                          capture_output=True, text=True)


def time_setups(args: argparse.Namespace, setups: tuple, launches: int,
                measure: Callable[[object, Path, Path, Path], object]
                ) -> tuple[dict, list[float]]:
    """``launches`` times over, each of ``setups`` in turn (e.g. rank counts):
    ``measure(setup, model, samples, scratch)`` on the inputs of ``args``, in a temporary
    folder (``scratch``: a path there of its own). Returns what ``measure`` returned, a list
    per setup, and the 1-minute load averages, before the first launch and after each."""
    got: dict = {setup: [] for setup in setups}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, samples = make_inputs(root, args.samples, args.length)
        for i in range(launches):
            for n, setup in enumerate(setups):
                got[setup].append(measure(setup, model, samples, root / f"{n}-{i}"))
                loads.append(os.getloadavg()[0])
    return got, loads


def write_result(result: dict, loads: list[float], out: str) -> None:
    """Add the machine (CPU count, ``loads``) to ``result``, print it as JSON and write it to
    ``out``."""
    result["machine"] = {"cpu_count": os.cpu_count(),
                         "load_avg_1m": [round(x, 1) for x in loads]}
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text + "\n")
