"""`mgrpo compare`: trained arms side by side on the same held-out questions.

An arm is a name and the run folders of its seeds (``mgrpo train``/``mgrpo ablate`` out
dirs, each with ``eval_after_questions.json`` and ``metrics.csv``). For each arm: held-out
accuracy after RL (mean over runs, greedy and sampled) and the generated tokens per round
(mean over rounds and runs), the measure an equal-budget comparison must match; then the
first arm against each other one, paired on the questions (``ablate.paired_markdown``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from mgrpo.experiments.ablate import paired_markdown
from mgrpo.training.metrics import read_metrics


def generated_tokens(run_dir: Path) -> list[float]:
    """Tokens sampled in each round: ``rollout/generated_tokens``, or for runs that predate
    it ``throughput/tokens_per_s * time/rollout_s`` (the same sum, divided then multiplied)."""
    series = read_metrics(Path(run_dir))
    if "rollout/generated_tokens" in series:
        return [v for _, v in series["rollout/generated_tokens"]]
    rate, secs = dict(series.get("throughput/tokens_per_s", [])), \
        dict(series.get("time/rollout_s", []))
    if not rate:
        raise ValueError(f"{run_dir}/metrics.csv has no generated-token metric")
    return [rate[r] * secs[r] for r in sorted(rate)]


def compare_markdown(arms: dict[str, list[str]], seed: int = 0) -> str:
    """Markdown: one row per arm, then the first arm minus each other arm, paired."""
    lines = ["| arm | runs | generated tokens per round | greedy after | sampled after |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, dirs in arms.items():
        tokens = [statistics.fmean(generated_tokens(Path(d))) for d in dirs]
        acc = {}
        for mode in ("greedy", "sampled"):
            per_run = [json.loads((Path(d) / "eval_after_questions.json").read_text())[mode]
                       for d in dirs]
            acc[mode] = statistics.fmean(statistics.fmean(r.values()) for r in per_run)
        lines.append(f"| {name} | {len(dirs)} | {statistics.fmean(tokens):.0f} "
                     f"({', '.join(f'{t:.0f}' for t in tokens)}) | {acc['greedy']:.3f} | "
                     f"{acc['sampled']:.3f} |")
    names = list(arms)
    results = {n: [{"out_dir": d} for d in dirs] for n, dirs in arms.items()}
    pairs = tuple((names[0], other) for other in names[1:])
    return "\n".join([*lines, "", *paired_markdown(results, seed=seed, pairs=pairs)]) + "\n"
