"""Episodes as a person reads them: ``mgrpo eval --episodes N`` and the completions a run
writes each round (``completions.jsonl``, TensorBoard's text tab, a W&B table, the
dashboard's Completions panel).

:func:`episode_record` turns one played episode (its trace: every agent's turns, the tool
calls and what they returned) and its scores into a JSON record; :func:`render_episode`
writes a record as indented text, one line per turn::

    episode q-kelvar #0   reward 1.0  correct 1.0  format ok
    question: What is the capital of Kelvar?   gold: Ostra
    planner -> web: capital of Kelvar
      web calls websearch: capital of Kelvar
        = The capital of Kelvar is Ostra.
      web returns: Ostra   (format ok, r_expert 1.0)
    planner answers: Ostra

:func:`sample_records` picks the few episodes of a round that a run writes (seeded by the
round); :func:`trajectory_record` is a distributed trainer's: one stored trajectory decoded.
What this module does not do: play or score episodes (``mgrpo.training.rounds``),
or write files (``mgrpo.training.metrics.MetricsLogger``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

MAX_CHARS = 400  # one observation or turn shown; the record keeps the text whole
INDENT = "  "


def episode_record(episode: Any, outcome: Any, expert: Sequence[float | None] = ()) -> dict:
    """One episode (``mgrpo.training.episodes.Episode``) and its ``PlannerOutcome`` as a
    JSON record; ``expert``: each sub-agent call's r_expert, in ``episode.subagents`` order
    (unknown: None)."""
    question = episode.job.question
    calls = [{"agent": t.agent, "invocation": t.invocation, "format_ok": t.format_ok,
              "r_expert": expert[i] if i < len(expert) else None}
             for i, t in enumerate(episode.subagents)]
    record = {"query_id": question.id, "rollout": episode.job.rollout,
              "question": question.question, "gold": question.answer,
              "answer": episode.answer, "format_ok": bool(episode.format_ok),
              "correct": float(outcome.correct), "reward": float(outcome.reward),
              "steps": list(episode.trace), "calls": calls}
    record["text"] = render_episode(record)
    return record


def render_episode(record: dict) -> str:
    """The record as indented text (see the module docstring)."""
    head = (f"episode {record['query_id']} #{record['rollout']}   reward "
            f"{record['reward']:g}  correct {record['correct']:g}  format "
            f"{'ok' if record['format_ok'] else 'broken'}")
    lines = [head, f"question: {_short(record['question'])}   gold: {_short(record['gold'])}"]
    experts = iter(record.get("calls", []))
    for step in record["steps"]:
        lines += _step_lines(step, 0, experts)
    return "\n".join(lines)


def render_episodes(records: Sequence[dict]) -> str:
    """Several records, each followed by a blank line."""
    return "".join(f"{record['text']}\n\n" for record in records)


def _step_lines(step: dict, depth: int, experts) -> list[str]:
    pad = INDENT * depth
    agent = step.get("agent", "?")
    if "error" in step:
        raw = f": {_short(step['raw'])!r}" if step.get("raw") else ""
        return [f"{pad}{agent}: {step['error']}{raw}"]
    if "answer" in step:
        return [f"{pad}{agent} answers: {_short(step['answer'])}"]
    if "steps" in step:  # a sub-agent's call: its own turns, then what it returned
        call = next(experts, None)  # calls are in play order, each before its own calls
        out = [f"{pad}{INDENT}{line}" for inner in step["steps"]
               for line in _step_lines(inner, 0, experts)]
        notes = ["format ok" if step.get("format_ok") else "format broken"]
        if call is not None and call.get("r_expert") is not None:
            notes.append(f"r_expert {call['r_expert']:g}")
        return out + [f"{pad}{INDENT}{agent} returns: {_short(step.get('result'))}   "
                      f"({', '.join(notes)})"]
    if "delegate" in step:
        out = [f"{pad}{agent} -> {step['delegate']}: {_short(step['task'])}"]
        for call in step.get("calls", []):  # a nested call, played by the delegate
            out += _step_lines(call, depth + 1, experts)
        return out
    if "tool" in step:
        return [f"{pad}{agent} calls {step['tool']}: {_short(step.get('input'))}",
                f"{pad}{INDENT}= {_short(step.get('observation'))}"]
    if step.get("inline"):
        return [f"{pad}{agent} (played by the planner) takes: {_short(step.get('task'))}"]
    if "result" in step:
        return [f"{pad}{agent} returns: {_short(step['result'])}"]
    return [f"{pad}{agent}: {_short(step)}"]


def _short(value: object) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."


def trajectory_record(traj: Any, tokenizer: Any) -> dict:
    """One stored trajectory (a distributed trainer's view: token ids, no episode trace) as
    a record: its agent, query, rollout, result, and its text decoded where
    ``response_mask`` changes, each generated run marked ``>>`` and the context fed to the
    agent (prompt, observations) marked ``..``."""
    ids, mask = traj.input_ids, traj.response_mask
    lines = [f"{traj.agent} #{traj.invocation} of {traj.query_id} #{traj.rollout}   format "
             f"{'ok' if traj.format_ok else 'broken'}   result: {_short(traj.result)}"]
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
            mark = ">> " if mask[start] else ".. "
            lines += [mark + line for line in text[-MAX_CHARS * 4:].splitlines() or [""]]
            start = end
    return {"query_id": traj.query_id, "rollout": traj.rollout, "agent": traj.agent,
            "invocation": traj.invocation, "format_ok": bool(traj.format_ok),
            "text": "\n".join(lines)}


def sample_records(records: Sequence[dict], n: int, seed: int) -> list[dict]:
    """``n`` of ``records`` chosen by ``seed`` (the same every resume), in their order."""
    if n <= 0 or not records:
        return []
    picked = sorted(random.Random(seed).sample(range(len(records)), min(n, len(records))))
    return [records[i] for i in picked]
