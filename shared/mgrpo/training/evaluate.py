"""Held-out evaluation: accuracy, format validity, calls per sub-agent, tokens per answer.

Sampled (temperature from the config, T = 1 by default) and greedy accuracy are both
reported: a warm start can look perfect greedily while its samples are noisy (SPEC 3).
"""

from __future__ import annotations

from collections import defaultdict

from mgrpo.training.rounds import collect, score


def evaluate(system, questions: list, greedy: bool, seed: int = 1234,
             batch: int = 64, progress=None) -> dict[str, float]:
    """Play one episode per question; returns ``eval/*`` metrics (see docs/metrics.md)."""
    correct = valid = tokens = 0.0
    calls: dict[str, float] = defaultdict(float)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for start in range(0, len(questions), batch):
        chunk = questions[start:start + batch]
        episodes = collect(system, "eval", chunk, k=1, seed=seed, greedy=greedy)
        for ep, outcome in zip(episodes, score(system, episodes), strict=True):
            correct += outcome.correct
            valid += float(ep.format_ok)
            tokens += sum(ep.planner.response_mask)
            tokens += sum(sum(t.response_mask) for t in ep.subagents)
            for role, n in ep.calls_per_role.items():
                calls[role] += n
            by_kind[ep.job.question.kind].append(outcome.correct)
        if progress is not None:
            progress(len(chunk))
    n = max(len(questions), 1)
    mode = "greedy" if greedy else "sampled"
    out = {f"eval/{mode}/accuracy": correct / n, f"eval/{mode}/format_valid": valid / n,
           f"eval/{mode}/tokens_per_answer": tokens / n}
    out.update({f"eval/{mode}/calls_{role}": c / n for role, c in calls.items()})
    out.update({f"eval/{mode}/accuracy_{kind}": sum(v) / len(v) for kind, v in by_kind.items()})
    return out
