"""SFT transcripts from a teacher by rejection sampling (``mgrpo data transcripts``).

A teacher engine (any ``mgrpo.engines`` engine: a local model, an OpenAI-compatible server)
plays every role of the run config (the planner and each sub-agent, with the run's tools) on
``samples`` rollouts per question; the episodes whose final answer the run's verifier scores
at least ``min_score`` are kept and written in the SFT format (docs/protocol.md): one
``{out}/{agent}.jsonl`` per role, each line one agent invocation whose segments are the
trajectory's prompt and observation text (``train: false``) and generated turns
(``train: true``), in the run's ``protocol.format`` (with ``chat_template``: the teacher
tokenizer's chat template), plus ``summary.json`` (played, kept, questions with a kept episode,
verifier errors).

What this module does not do: load the teacher (the CLI does, as the services load engines)
or train on the transcripts (``mgrpo sft``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mgrpo.envs.demos import pick_questions
from mgrpo.envs.turn_formats import build_turn_format
from mgrpo.progress import progress_bar
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeJob, EpisodeRunner, mix_seed
from mgrpo.training.judging import verifier_for_run
from mgrpo.training.subagents import LocalSubagentPool
from mgrpo.training.system import build_tools, role_cards, role_description
from mgrpo.types import Trajectory


def trajectory_segments(traj: Trajectory, tokenizer: Any) -> list[dict]:
    """The trajectory as SFT segments: each run of equal ``response_mask`` decoded to text,
    ``train`` where the agent generated it."""
    ids, mask = traj.input_ids, traj.response_mask
    segments, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
            segments.append({"text": text, "train": bool(mask[start])})
            start = end
    return segments


def write_transcripts(cfg: RunConfig, bench: Any, engine: Any, tokenizer: Any,
                      out: str | Path, split: str = "train", n: int | None = None,
                      samples: int = 4, seed: int = 0, min_score: float = 1.0,
                      batch_size: int = 16, progress: bool = False) -> dict:
    """Play ``samples`` rollouts of ``n`` questions of ``split`` with ``engine`` in every
    role and write the correct ones; returns the summary."""
    sub_roles = [r for r in cfg.agents if r != "planner"]
    tools = build_tools(bench, sub_roles, None, cfg.tools, cfg.role_tools)
    turn_format = build_turn_format(cfg.protocol.format, tokenizer,
                                    cfg.protocol.tool_call_format,
                                    cfg.protocol.template_text())
    runtimes = {role: AgentRuntime(role=role, model="teacher", engine=engine,
                                   tokenizer=tokenizer, tool=tools.get(role),
                                   description=role_description(role, cfg.descriptions),
                                   turn_format=turn_format)
                for role in cfg.agents}
    subs = {r: rt for r, rt in runtimes.items() if r != "planner"}
    runner = EpisodeRunner(runtimes["planner"], role_cards(runtimes, cfg.descriptions),
                           cfg.sampling,
                           dispatch=LocalSubagentPool(subs, cfg.sampling))
    verifier = verifier_for_run(cfg)
    questions = pick_questions(bench, split, n, None, seed)
    jobs = [EpisodeJob(q, "transcripts", r, mix_seed(seed, "transcripts", q.id, r))
            for q in questions for r in range(samples)]
    lines: dict[str, list[str]] = {}
    kept, solved = 0, set()
    bar = progress_bar(total=len(jobs), desc="transcripts", enabled=progress)
    for start in range(0, len(jobs), batch_size):
        for episode in runner.run(jobs[start:start + batch_size], greedy=False):
            question = episode.job.question
            score = (verifier.score(episode.answer or "", question.answer, question.question)
                     if episode.format_ok else 0.0)
            if score < min_score:
                continue
            kept += 1
            solved.add(question.id)
            for traj in (episode.planner, *episode.subagents):
                record = {"agent": traj.agent,
                          "segments": trajectory_segments(traj, tokenizer)}
                lines.setdefault(traj.agent, []).append(
                    json.dumps(record, sort_keys=True, ensure_ascii=False))
        bar.update(min(batch_size, len(jobs) - start))
        bar.set_postfix(kept=kept)
    bar.close()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    for agent, rows in sorted(lines.items()):
        (root / f"{agent}.jsonl").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    summary = {"played": len(jobs), "kept": kept, "questions": len(questions),
               "questions_solved": len(solved), "split": split, "samples": samples,
               "seed": seed, "min_score": min_score, "verifier_errors": verifier.errors,
               "records": {a: len(r) for a, r in sorted(lines.items())}}
    (root / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n",
                                       encoding="utf-8")
    return summary
