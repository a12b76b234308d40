"""Held-out evaluation: accuracy, format validity, calls per sub-agent, tokens per answer,
and each sub-agent's own correctness (r_expert, the run's judge; a format-invalid call
scores 0) averaged over its calls.

Sampled (temperature from the config, T = 1 by default) and greedy accuracy are both
reported: a warm start can look perfect greedily while its samples are noisy.
"""

from __future__ import annotations

import time
from collections import defaultdict

from mgrpo.progress import progress_bar
from mgrpo.training.episode_text import episode_record
from mgrpo.training.episodes import SubagentCall, mix_seed
from mgrpo.training.rounds import collect, score
from mgrpo.training.run_state import write_json_atomic
from mgrpo.training.scoring import expert_verdicts
from mgrpo.training.subagents import run_subagent_calls
from mgrpo.training.system import out_path


def evaluate(system, questions: list, greedy: bool, seed: int = 1234,
             batch: int = 64, progress=None,
             per_question: dict[str, float] | None = None,
             records: list[dict] | None = None, keep: int = 0) -> dict[str, float]:
    """Play one episode per question; returns ``eval/*`` metrics (see docs/metrics.md).
    ``per_question`` (if given) receives each question id's correctness (paired
    comparisons of two systems on the same questions: ``mgrpo.algo.paired``); ``records``
    the first ``keep`` episodes as readable records (``mgrpo.training.episode_text``)."""
    correct = valid = tokens = 0.0
    calls: dict[str, float] = defaultdict(float)
    by_kind: dict[str, list[float]] = defaultdict(list)
    expert: dict[str, list[float]] = defaultdict(list)
    for start in range(0, len(questions), batch):
        chunk = questions[start:start + batch]
        episodes = collect(system, "eval", chunk, k=1, seed=seed, greedy=greedy)
        outcomes = score(system, episodes)
        for ep, outcome in zip(episodes, outcomes, strict=True):
            correct += outcome.correct
            valid += float(ep.format_ok)
            tokens += sum(ep.planner.response_mask)
            tokens += sum(sum(t.response_mask) for t in ep.subagents)
            for role, n in ep.calls_per_role.items():
                calls[role] += n
            by_kind[ep.job.question.kind].append(outcome.correct)
            if per_question is not None:
                per_question[ep.job.question.id] = float(outcome.correct)
        calls_made = [t for ep in episodes for t in ep.subagents]
        verdicts = iter(expert_verdicts([t for t in calls_made if t.format_ok], system.judge))
        scores = [float(next(verdicts).score) if t.format_ok else 0.0 for t in calls_made]
        for traj, value in zip(calls_made, scores, strict=True):
            expert[traj.agent].append(value)
        if records is not None and len(records) < keep:
            _keep_records(records, keep, episodes, outcomes, iter(scores))
        if progress is not None:
            progress(len(chunk))
    n = max(len(questions), 1)
    mode = "greedy" if greedy else "sampled"
    out = {f"eval/{mode}/accuracy": correct / n, f"eval/{mode}/format_valid": valid / n,
           f"eval/{mode}/tokens_per_answer": tokens / n}
    out.update({f"eval/{mode}/calls_{role}": c / n for role, c in calls.items()})
    out.update({f"eval/{mode}/accuracy_{kind}": sum(v) / len(v) for kind, v in by_kind.items()})
    out.update({f"eval/{mode}/r_expert_{role}": sum(v) / len(v) for role, v in expert.items()})
    return out


def _keep_records(records: list[dict], keep: int, episodes: list, outcomes: list,
                  scores) -> None:
    """Append the readable records of ``episodes`` until ``records`` holds ``keep``;
    ``scores``: every call's r_expert, in the episodes' order."""
    for ep, outcome in zip(episodes, outcomes, strict=True):
        expert = [next(scores) for _ in ep.subagents]
        if len(records) < keep:
            records.append(episode_record(ep, outcome, expert))


def evaluate_subagent(system, role: str, questions: list, greedy: bool, seed: int = 1234,
                      ) -> dict[str, float]:
    """``role`` alone on the gold subtasks of ``questions`` (the tasks a perfect planner
    would give it): its own correctness (r_expert, the run's judge) and format validity,
    free of the planner's errors. Returns ``eval/{mode}/{role}_alone/*``."""
    calls = [SubagentCall(key=("eval-alone", q.id, 0), role=role, task=st.task, invocation=i,
                          seed=mix_seed(seed, q.id, i))
             for q in questions for i, st in enumerate(s for s in q.subtasks if s.agent == role)]
    mode = "greedy" if greedy else "sampled"
    prefix = f"eval/{mode}/{role}_alone"
    if not calls:
        return {f"{prefix}/tasks": 0.0}
    outcomes = run_subagent_calls(system.runtimes[role], calls, system.cfg.sampling,
                                  greedy=greedy)
    trajs = [o.trajectory for o in outcomes]
    valid = [t for t in trajs if t.format_ok]
    scores = iter(expert_verdicts(valid, system.judge))
    r_expert = [float(next(scores).score) if t.format_ok else 0.0 for t in trajs]
    return {f"{prefix}/tasks": float(len(calls)),
            f"{prefix}/r_expert": sum(r_expert) / len(calls),
            f"{prefix}/format_valid": len(valid) / len(calls)}


def evaluate_both(system, test: list, logger, tag: str, step: int) -> dict:
    """Sampled and greedy held-out accuracy of ``system`` on ``test``, written to
    ``eval_{tag}.json`` (and each question's to ``eval_{tag}_questions.json``) and logged by
    ``logger`` (a ``MetricsLogger``) at ``step`` = rounds of updates so far (round metrics at
    step r describe round r's rollouts, made before its update)."""
    started = time.perf_counter()
    out = {}
    questions: dict[str, dict[str, float]] = {}
    with progress_bar(desc=f"eval {tag}", total=2 * len(test), enabled=logger.enabled) as bar:
        for greedy in (False, True):
            per = questions.setdefault("greedy" if greedy else "sampled", {})
            out.update(evaluate(system, test, greedy=greedy, progress=bar.update,
                                per_question=per))
    write_json_atomic(out_path(system.cfg, f"eval_{tag}.json"), out)
    # each question's correctness, for paired comparisons across runs (mgrpo ablate)
    write_json_atomic(out_path(system.cfg, f"eval_{tag}_questions.json"), questions)
    logger.log_eval(step, out, tag, seconds=time.perf_counter() - started)
    return out
