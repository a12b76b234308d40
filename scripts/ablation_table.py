"""Per-variant, per-seed held-out metrics of an `mgrpo ablate` output folder, before and
after RL, from each run's metrics.csv (accuracy per question kind, calls per episode, each
sub-agent's r_expert over its calls, format validity).

    python scripts/ablation_table.py runs/ablate-s2 0,1,2,3,4 [out.json]
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

KEYS = ("accuracy", "accuracy_chain", "accuracy_compare", "accuracy_arith", "calls_coder",
        "calls_searcher", "r_expert_coder", "r_expert_searcher", "format_valid")
VARIANTS = ("single-agent", "main-only", "co-training")


def run_metrics(run_dir: Path) -> dict:
    """{"before"|"after": {"greedy"|"sampled": {key: value}}} of one finished run."""
    rows = list(csv.DictReader(run_dir.joinpath("metrics.csv").open()))
    values = {(int(r["round"]), r["key"]): float(r["value"]) for r in rows}
    last = max(int(r["round"]) for r in rows)
    return {when: {mode: {k: values.get((step, f"eval/{mode}/{k}"), float("nan"))
                          for k in KEYS} for mode in ("greedy", "sampled")}
            for when, step in (("before", 0), ("after", last))}


def main(root: Path, seeds: list[int]) -> dict:
    out: dict[str, dict[int, dict]] = {}
    for variant in VARIANTS:
        for seed in seeds:
            run_dir = root / variant / f"seed{seed}"
            if (run_dir / "eval_after_questions.json").exists():
                out.setdefault(variant, {})[seed] = run_metrics(run_dir)
    for variant, runs in out.items():
        print(f"## {variant}: seeds {sorted(runs)}")
        for mode in ("greedy", "sampled"):
            for key in KEYS:
                before = statistics.fmean(r["before"][mode][key] for r in runs.values())
                after = [runs[s]["after"][mode][key] for s in sorted(runs)]
                print(f"{mode:8s} {key:18s} before {before:.3f} after mean "
                      f"{statistics.fmean(after):.3f}  per seed "
                      + " / ".join(f"{x:.3f}" for x in after))
    return out


if __name__ == "__main__":
    table = main(Path(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")])
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps(table, indent=1))
