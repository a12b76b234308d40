"""The demo's held-out accuracy, synchronous vs asynchronous (issue 15.2: does it still learn?).

Runs ``mgrpo demo`` twice, one after the other (never both at once), same seed, torch at
1 thread (the demo's ``threads``; ``OMP_NUM_THREADS=1`` too), each in its own process and
folder under ``--out``:

- **sync**: ``mgrpo demo`` as ``make demo`` runs it;
- **async**: ``mgrpo demo --set max_staleness=N --set loss.rollout_is=token`` (round n+1 is
  sampled by weights N updates old while round n trains, in a second thread; the loss is
  weighted by truncated pi_old / pi_rollout per token).

Each demo builds its own warm start from the same seed; the script hashes both warm starts'
weights (they should be identical at 1 thread) and reads each run's held-out figures
(``summary.json``: greedy and sampled accuracy, searcher calls per episode, before and after
RL) and per-question results (``run/eval_{before,after}_questions.json``). Paired
comparisons on the same held-out questions (``mgrpo.algo.paired.paired_bootstrap``, 95%
percentile interval over questions): async - sync after RL, and after - before within each
run. One run per arm: the intervals cover question sampling only, not seed-to-seed spread.

Recorded per run: wall seconds, ``os.getloadavg()`` before and after and sampled every 15 s
during (other processes on the machine share its cores: wall times are only as clean as
that load). Output: ``bench/results/demo_async.json``.

Usage (~20-40 min on 2 loaded cores)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/demo_async.py --out runs/demo-async-bench
    # smaller demos (both arms): --demo-config FILE, DemoConfig fields as `mgrpo demo --config`
    # or only summarise two finished demo folders:
    .venv/bin/python bench/demo_async.py --summarise --out runs/demo-async-bench
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULT_FILE = Path(__file__).resolve().parent / "results" / "demo_async.json"
KEYS = ("eval/greedy/accuracy", "eval/sampled/accuracy", "eval/greedy/calls_searcher",
        "eval/sampled/calls_searcher", "eval/greedy/format_valid",
        "eval/greedy/tokens_per_answer")


def run_demo(out: Path, extra: list[str]) -> dict:
    """One ``mgrpo demo`` in a fresh process; wall time and the load around and during it."""
    if out.exists():
        raise SystemExit(f"{out} exists: a demo reuses a finished warm start and a run folder "
                         "holds one run; pick a fresh --out or pass --summarise")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", "from mgrpo.cli.main import app; app()", "demo",
           "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    samples: list[list[float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(15.0):
            samples.append([round(x, 2) for x in os.getloadavg()])

    load_before = list(os.getloadavg())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    with open(f"{out}.log", "w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if rc != 0:
        raise SystemExit(f"mgrpo demo {' '.join(extra)} failed ({rc}): see {out}.log")
    meta = {"command": "mgrpo demo --out " + " ".join([str(out), *extra]),
            "wall_s": round(wall, 1), "load_before": load_before,
            "load_after": list(os.getloadavg()), "load_1min_during": [s[0] for s in samples]}
    (out / "bench_run.json").write_text(json.dumps(meta, indent=2))
    return meta


def warm_start_hashes(out: Path) -> dict[str, str]:
    """SHA-256 of each role's warm-started weights (models/sft/<role>/*.safetensors)."""
    hashes = {}
    for role_dir in sorted((out / "models" / "sft").iterdir()):
        digest = hashlib.sha256()
        for f in sorted(role_dir.glob("*.safetensors")):
            digest.update(f.read_bytes())
        hashes[role_dir.name] = digest.hexdigest()[:16]
    return hashes


def questions(out: Path, tag: str, mode: str) -> dict[str, float]:
    return json.loads((out / "run" / f"eval_{tag}_questions.json").read_text())[mode]


def paired(a: dict[str, float], b: dict[str, float]) -> dict:
    """mean(a) - mean(b) over the questions both have, with its 95% paired interval."""
    from mgrpo.algo.paired import paired_bootstrap

    common = sorted(set(a) & set(b))
    res = paired_bootstrap([a[q] for q in common], [b[q] for q in common], seed=0)
    return {"diff": round(res.diff, 4), "low": round(res.low, 4), "high": round(res.high, 4),
            "questions": res.questions, "excludes_0": res.significant}


def summarise(dirs: dict[str, Path]) -> dict:
    arms = {}
    for arm, out in dirs.items():
        summary = json.loads((out / "summary.json").read_text())
        meta_path = out / "bench_run.json"
        arms[arm] = {
            "before": {k: summary["before"].get(k) for k in KEYS},
            "after": {k: summary["after"].get(k) for k in KEYS},
            "rounds": summary["rounds"], "run_set": summary.get("run_set", {}),
            "demo_wall_s": summary["wall_s"], "warm_start_sha256": warm_start_hashes(out),
            **(json.loads(meta_path.read_text()) if meta_path.exists() else {}),
            "learned": {mode: paired(questions(out, "after", mode),
                                     questions(out, "before", mode))
                        for mode in ("greedy", "sampled")},
        }
    a, s = dirs["async"], dirs["sync"]
    return {
        "arms": arms,
        "same_warm_start": arms["sync"]["warm_start_sha256"]
        == arms["async"]["warm_start_sha256"],
        "same_before": arms["sync"]["before"] == arms["async"]["before"],
        "async_minus_sync_after": {mode: paired(questions(a, "after", mode),
                                                questions(s, "after", mode))
                                   for mode in ("greedy", "sampled")},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo-async-bench"))
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["sync", "async"], default=None,
                        help="run one arm (the other folder must exist to summarise)")
    parser.add_argument("--summarise", action="store_true",
                        help="do not run; summarise the finished folders under --out")
    parser.add_argument("--result", type=Path, default=RESULT_FILE)
    parser.add_argument("--demo-config", type=Path, default=None,
                        help="YAML of DemoConfig fields for both demos (`mgrpo demo --config`)")
    args = parser.parse_args(argv)
    common = ["--seed", str(args.seed)]
    if args.demo_config is not None:
        common += ["--config", str(args.demo_config)]
    extras = {"sync": common,
              "async": [*common, "--set", f"max_staleness={args.staleness}",
                        "--set", "loss.rollout_is=token"]}
    dirs = {arm: args.out / arm for arm in extras}
    if not args.summarise:
        for arm in ([args.only] if args.only else list(extras)):
            print(f"{arm}: {json.dumps(run_demo(dirs[arm], extras[arm]))}", flush=True)
    result = {"bench": "demo_async", "host": socket.gethostname(),
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "staleness": args.staleness, "seed": args.seed,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              **summarise(dirs)}
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
