"""`make demo-real`: the M-GRPO recipe on a real pretrained model, each step one `mgrpo` command.

1. the benchmark (`mgrpo data build`) and the experts' demonstrations in the model's own chat
   template with native tool calls (`mgrpo data demos --chat-model`), the planner skipping
   delegation in half of them, as `make demo` does;
2. zero-shot held-out evaluation, greedy and sampled (`mgrpo eval`);
3. the warm start: `mgrpo sft` of the planner and the searcher (a LoRA adapter merged into
   each agent's own copy of the weights), then the same evaluation;
4. M-GRPO rounds from that warm start, once per seed (`mgrpo train --set seed=S`), each
   evaluated again on the same questions;
5. ``OUT/summary.json`` and ``OUT/summary.md``: accuracy per stage, and RL's gain over the warm
   start with a paired interval that resamples seeds, then questions
   (:func:`mgrpo.algo.paired.seed_task_bootstrap`).

Every step's command and output are in ``OUT/logs``; a step whose output exists is skipped, so
a second run resumes where the first stopped. ``--smoke`` shrinks every size (the test of this
script runs it on a tiny model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))

from mgrpo.algo.paired import seed_task_bootstrap  # noqa: E402


def run(args: list[str], log: Path) -> None:
    """One `mgrpo` command, its stdout and stderr in ``log``; exit on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "mgrpo.cli.main", *args]  # this venv's mgrpo
    start = time.perf_counter()
    print(f"[demo-real] mgrpo {' '.join(args)}", flush=True)
    with open(log, "w", encoding="utf-8") as handle:
        handle.write("mgrpo " + " ".join(args) + "\n")
        handle.flush()
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                              check=False)
    print(f"[demo-real]   {time.perf_counter() - start:.0f} s -> {log}", flush=True)
    if done.returncode:
        sys.exit(f"demo-real: step failed (exit {done.returncode}); see {log}")


def scores(out: Path) -> tuple[float, dict[str, float]]:
    """(accuracy, question id -> correct) of an evaluation written with --out and --episodes."""
    result = json.loads(out.read_text())
    key = next(k for k in result if k.endswith("/accuracy") and k.startswith("eval/"))
    per = {}
    for line in out.with_suffix(".episodes.jsonl").read_text().splitlines():
        record = json.loads(line)
        per[record["query_id"]] = float(record["correct"])
    return result[key], per


def evaluate(cfg: Path, out: Path, logs: Path, n: int, sets: list[str],
             checkpoints: bool = False) -> dict:
    """Greedy and sampled accuracy (and per-question scores) of one set of weights."""
    found = {}
    out.mkdir(parents=True, exist_ok=True)
    for mode in ("greedy", "sampled"):
        target = out / f"{mode}.json"
        if not target.exists():
            run(["eval", "--config", str(cfg), "--split", "test", "--n", str(n),
                 "--greedy" if mode == "greedy" else "--no-greedy", "--episodes", str(n),
                 "--out", str(target), *(["--checkpoints"] if checkpoints else []),
                 *[a for s in sets for a in ("--set", s)]], logs / f"{out.name}-{mode}.log")
        found[mode] = scores(target)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/models/smollm2-135m-instruct")
    parser.add_argument("--config", default="examples/real_smollm2.yaml")
    parser.add_argument("--out", default="runs/real")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--eval-n", type=int, default=200)
    parser.add_argument("--demos", type=int, default=400)
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=384, help="SFT tokens per example")
    parser.add_argument("--smoke", action="store_true", help="every size shrunk: a test")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.eval_n, args.demos, args.sft_steps = 1, 4, 8, 2
        args.max_length = 2048  # a tiny tokenizer spends many tokens on the prompt
    out, cfg = Path(args.out), Path(args.config)
    logs = out / "logs"
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    seeds = [int(s) for s in args.seeds.split(",")]
    ckpt = out / "ckpt"
    # the config names ../runs/real/...: every path is set here for any --out
    paths = [f"bench_dir={out / 'bench'}"]
    smoke = ["k=2", "queries_per_round=2", "sampling.max_new_tokens=24"] if args.smoke else []

    if not (out / "bench").is_dir():
        run(["data", "build", "--seed", "0", "--out", str(out / "bench")], logs / "bench.log")
    if not (out / "demos" / "planner.jsonl").exists():
        run(["data", "demos", "--bench", str(out / "bench"), "--out", str(out / "demos"),
             "--n", str(args.demos), "--stage", "1",
             "--error-rate", "planner.skip_delegation=0.5", "--chat-model", args.model,
             "--roles", "searcher", "--tool-call-format", "json_list",
             "--min-accuracy", "0"], logs / "demos.log")

    base = [f"models.{m}.path={args.model}" for m in ("planner", "searcher")]
    zero = evaluate(cfg, out / "eval" / "zero_shot", logs, args.eval_n, paths + base + smoke)

    for agent in ("planner", "searcher"):
        if not (ckpt / agent / "v000000").exists():
            run(["sft", "--model", args.model, "--data", str(out / "demos" / f"{agent}.jsonl"),
                 "--agent", agent, "--name", agent, "--out", str(ckpt),
                 "--steps", str(args.sft_steps), "--batch-size", "8",
                 "--micro-batch-size", "4", "--max-length", str(args.max_length),
                 "--lora-r", str(args.lora_r), "--log-every", "5"], logs / f"sft-{agent}.log")
    warm_paths = [f"models.{m}.path={ckpt / m / 'v000000'}" for m in ("planner", "searcher")]
    warm = evaluate(cfg, out / "eval" / "warm", logs, args.eval_n, paths + warm_paths + smoke)

    after = {}
    for seed in seeds:
        run_dir = out / f"rl-seed{seed}"
        sets = paths + warm_paths + smoke + [f"seed={seed}", f"out_dir={run_dir}"]
        if not (run_dir / "done").exists():
            run(["train", "--config", str(cfg), "--rounds", str(args.rounds), "--overwrite",
                 *[a for s in sets for a in ("--set", s)]], logs / f"train-seed{seed}.log")
            (run_dir / "done").write_text("")
        after[seed] = evaluate(cfg, out / "eval" / f"rl_seed{seed}", logs, args.eval_n, sets,
                               checkpoints=True)

    summary = {"model": args.model, "seeds": seeds, "rounds": args.rounds,
               "eval_questions": args.eval_n, "sft_steps": args.sft_steps,
               "demos": args.demos}
    lines = ["| stage | greedy | sampled |", "| --- | ---: | ---: |"]
    for name, found in [("zero-shot", zero), ("warm start (SFT)", warm),
                        *((f"after RL, seed {s}", after[s]) for s in seeds)]:
        summary[name] = {mode: found[mode][0] for mode in found}
        lines.append(f"| {name} | {found['greedy'][0]:.3f} | {found['sampled'][0]:.3f} |")
    for mode in ("greedy", "sampled"):
        ids = sorted(warm[mode][1])
        a = [[after[s][mode][1].get(q, 0.0) for q in ids] for s in seeds]
        b = [[warm[mode][1][q] for q in ids] for _ in seeds]
        interval = seed_task_bootstrap(a, b)
        summary[f"rl_gain_{mode}"] = {"diff": interval.diff, "low": interval.low,
                                       "high": interval.high, "level": interval.level,
                                       "seeds": len(seeds), "questions": len(ids)}
        lines.append(f"\nRL over the warm start, {mode}: {interval.diff:+.3f} "
                     f"[{interval.low:+.3f}, {interval.high:+.3f}] ({len(seeds)} seeds x "
                     f"{len(ids)} questions, seeds then questions resampled)")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
