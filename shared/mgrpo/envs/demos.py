"""Write expert demonstrations as SFT data: ``{out}/{agent}.jsonl``, one object per line.

Line format (what ``mgrpo.models.sft`` reads), keys sorted::

    {"agent": "planner", "segments": [{"text": "<|agents|>...<|planner|>", "train": false},
                                      {"text": "<call>searcher|population of Varnholt</call>",
                                       "train": true},
                                      {"text": "<ret>48213</ret>", "train": false}, ...]}

Also ``{out}/summary.json``: episodes, expert accuracy, and each error type's count and the
number of chances it had (its realised rate is count / chances).

What this module does not do: decide error rates (the caller does) or train anything.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mgrpo.envs.benchmark import Benchmark
from mgrpo.envs.experts import EpisodeTranscript, ExpertErrors, run_expert_episode


def pick_questions(bench: Benchmark, split: str, n: int | None, stage: int | None,
                   seed: int) -> list:
    """``n`` questions of the split (all if None), shuffled by ``seed``; cycled if n > pool."""
    pool = list(bench.questions(split, stage=stage))
    if not pool:
        raise ValueError(f"split {split!r} stage {stage} has no questions")
    random.Random(seed).shuffle(pool)
    n = len(pool) if n is None else n
    return [pool[i % len(pool)] for i in range(n)]


def error_chances(episodes: list[EpisodeTranscript]) -> dict[str, dict[str, int]]:
    """Per ``agent.type`` error: ``{"count": injected, "chances": draws}``; the realised rate
    is count / chances (a chance is one Bernoulli draw, see ``AgentTranscript.draw``)."""
    stats: dict[str, dict[str, int]] = {}
    for ep in episodes:
        for key, n in ep.chances.items():
            stats.setdefault(key, {"count": 0, "chances": 0})["chances"] += n
        for key in ep.errors:
            stats[key]["count"] += 1
    return dict(sorted(stats.items()))


def write_demos(bench: Benchmark, out: str | Path, tools: dict, errors: ExpertErrors,
                n: int | None = None, split: str = "train", stage: int | None = None,
                seed: int = 0, progress: bool = False) -> dict:
    """Run the expert on ``n`` questions and write per-agent JSONL plus ``summary.json``."""
    from mgrpo.progress import progress_bar

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    questions = pick_questions(bench, split, n, stage, seed)
    episodes = [run_expert_episode(q, tools, errors, rng)
                for q in progress_bar(questions, desc="demos", enabled=progress)]
    lines: dict[str, list[str]] = {}
    for ep in episodes:
        for record in ep.sft_records():
            lines.setdefault(record["agent"], []).append(
                json.dumps(record, sort_keys=True, ensure_ascii=False))
    for agent, rows in sorted(lines.items()):
        (root / f"{agent}.jsonl").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    summary = {"episodes": len(episodes), "split": split, "stage": stage, "seed": seed,
               "accuracy": sum(ep.correct for ep in episodes) / len(episodes),
               "records": {a: len(r) for a, r in sorted(lines.items())},
               "errors": error_chances(episodes), "error_rates": errors.model_dump()}
    (root / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n",
                                       encoding="utf-8")
    return summary
