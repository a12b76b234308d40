"""Write expert demonstrations as SFT data: ``{out}/{agent}.jsonl``, one object per line.

Line format (what ``mgrpo.models.sft`` reads), keys sorted::

    {"agent": "planner", "segments": [{"text": "<|agents|>...<|planner|>", "train": false},
                                      {"text": "<call>searcher|population of Varnholt</call>",
                                       "train": true},
                                      {"text": "<ret>48213</ret>", "train": false}, ...]}

With ``chat`` (a ``chat_template`` turn format and the planner's agent cards) each record is
the episode in that model's chat template with native tool calls instead
(:mod:`mgrpo.envs.chat_demos`).

Also ``{out}/summary.json``: episodes, expert accuracy, and each error type's count and the
number of chances it had (its realised rate is count / chances).

The scripted experts know only the built-in benchmark's tasks (look-ups in its documents,
arithmetic). On other data they answer wrongly, and SFT on their transcripts teaches the
planner to give up: with ``min_accuracy`` :func:`write_demos` refuses (writing nothing) when
the experts' accuracy on the episodes without injected errors is below it.

What this module does not do: decide error rates (the caller does) or train anything.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mgrpo.envs import protocol as P
from mgrpo.envs.benchmark import Benchmark
from mgrpo.envs.chat_demos import chat_records
from mgrpo.envs.experts import EpisodeTranscript, ExpertErrors, run_expert_episode
from mgrpo.progress import progress_bar


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


class ExpertsCannotSolve(ValueError):
    """The scripted experts' accuracy on a benchmark is under the threshold."""


def clean_accuracy(episodes: list[EpisodeTranscript]) -> tuple[float | None, int]:
    """(accuracy, episodes) over the episodes without injected errors: what the experts can
    do on this benchmark; (None, 0) when every episode had an injected error."""
    clean = [ep for ep in episodes if not ep.errors]
    return (sum(ep.correct for ep in clean) / len(clean) if clean else None), len(clean)


def write_demos(bench: Benchmark, out: str | Path, tools: dict, errors: ExpertErrors,
                n: int | None = None, split: str = "train", stage: int | None = None,
                seed: int = 0, progress: bool = False,
                min_accuracy: float | None = None,
                chat: tuple[object, list[P.AgentCard]] | None = None) -> dict:
    """Run the expert on ``n`` questions and write per-agent JSONL plus ``summary.json``.
    ``min_accuracy``: raise :class:`ExpertsCannotSolve` (nothing written) when
    :func:`clean_accuracy` is below it. ``chat``: ``(turn format, planner's cards)`` to write
    the records in a chat template (the experts then delegate to those cards' roles only)."""
    root = Path(out)
    rng = random.Random(seed)
    questions = pick_questions(bench, split, n, stage, seed)
    agents = chat[1] if chat else P.DEFAULT_AGENTS
    episodes = [run_expert_episode(q, tools, errors, rng, agents)
                for q in progress_bar(questions, desc="demos", enabled=progress)]
    accuracy, judged = clean_accuracy(episodes)
    if min_accuracy is not None and accuracy is not None and accuracy < min_accuracy:
        raise ExpertsCannotSolve(
            f"the scripted experts answer {accuracy:.0%} of {judged} {split} questions "
            f"correctly (under {min_accuracy:.0%}): they know only the built-in benchmark's "
            "tasks, and SFT on wrong demonstrations teaches the planner to give up; nothing "
            "was written")
    root.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = {}
    for ep, question in zip(episodes, questions, strict=True):
        records = (chat_records(ep, question.question, chat[0], chat[1], tools) if chat
                   else ep.sft_records())
        for record in records:
            lines.setdefault(record["agent"], []).append(
                json.dumps(record, sort_keys=True, ensure_ascii=False))
    for agent, rows in sorted(lines.items()):
        (root / f"{agent}.jsonl").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    summary = {"episodes": len(episodes), "split": split, "stage": stage, "seed": seed,
               "accuracy": sum(ep.correct for ep in episodes) / len(episodes),
               "expert_accuracy": accuracy,
               "records": {a: len(r) for a, r in sorted(lines.items())},
               "errors": error_chances(episodes), "error_rates": errors.model_dump(),
               "format": getattr(chat[0], "name", "chat_template") if chat else "markup"}
    (root / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n",
                                       encoding="utf-8")
    return summary
