"""SFT data for the single-agent baseline (``algorithm: grpo``; docs/algorithm.md, 'Algorithms
by mode'): one context that plays every role.

The ``grpo`` algorithm runs :class:`~mgrpo.training.episodes.EpisodeRunner` with
``inline_tools``: after the planner's model generates ``<call>searcher|task</call>`` it goes
on generating the sub-agent's turns in the SAME context (``<tool>q</tool>``, the runner
appends ``<obs>...</obs>``, then ``<return>x</return>``) and then its next planner turn. No
sub-agent header (``<|task|>...<|searcher|>``) and no ``<ret>...</ret>`` are appended in
inline mode: the returned value is already in the context.

:func:`inline_records` rewrites an expert's multi-agent transcript into exactly that layout,
so segment-wise encoding (``mgrpo.models.sft.encode_segments``) gives token for token the
ids and response mask the inline runner builds (tested with a replaying engine)::

    planner header | <call>searcher|t</call> | <tool>q</tool> | <obs>o</obs> |
    <return>x</return> | ... | <answer>a</answer>
      train: F          T                       T                F
      T                        T

What this module does not do: run experts or tools (``mgrpo.envs.experts``), train
(``mgrpo.models.sft``), or decide error rates (the caller does).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mgrpo import protocol_tokens as T
from mgrpo.envs.benchmark import Benchmark
from mgrpo.envs.demos import error_chances, pick_questions
from mgrpo.envs.experts import EpisodeTranscript, ExpertErrors, run_expert_episode

INLINE_AGENT = "planner"  # the single agent's records train the planner's model


def _segment(text: str, train: bool) -> dict:
    return {"text": text, "train": train}


def inline_records(transcript: EpisodeTranscript) -> dict:
    """One single-context SFT record ``{"agent": "planner", "segments": [...]}``.

    Each planner ``<call>`` is followed by the called sub-agent's own turns and observations
    (its header dropped), and the planner's ``<ret>`` segment is dropped. Sub-agent
    transcripts are consumed in order, one per call; a transcript whose calls and
    sub-agents do not pair up is rejected (it was not made by ``run_expert_episode``).
    """
    subs = iter(transcript.subagents)
    segments: list[dict] = []
    calls = 0
    for seg in transcript.planner.segments:
        if not seg.train and seg.text.startswith(T.RET_OPEN):
            continue  # inline mode: the value came back inside the context already
        segments.append(_segment(seg.text, seg.train))
        if seg.train and seg.text.startswith(T.CALL_OPEN):
            calls += 1
            sub = next(subs, None)
            if sub is None:
                raise ValueError(f"transcript {transcript.question_id!r}: planner call "
                                 f"#{calls} has no sub-agent transcript "
                                 f"({len(transcript.subagents)} for its calls)")
            # segments[0] is the sub-agent header, which inline mode never shows
            segments += [_segment(s.text, s.train) for s in sub.segments[1:]]
    if next(subs, None) is not None:
        raise ValueError(f"transcript {transcript.question_id!r} has "
                         f"{len(transcript.subagents)} sub-agent transcripts for {calls} "
                         "planner calls; each call must have exactly one")
    return {"agent": INLINE_AGENT, "segments": segments}


def write_inline_demos(bench: Benchmark, out: str | Path, tools: dict, errors: ExpertErrors,
                       n: int | None = None, split: str = "train", stage: int | None = None,
                       seed: int = 0) -> dict:
    """Like :func:`mgrpo.envs.demos.write_demos`, for the single-agent baseline: writes
    ``{out}/planner.jsonl`` (inline records) and ``{out}/summary.json``.

    The same ``(bench, n, stage, seed, errors)`` as ``write_demos`` replays the same expert
    episodes, so the baseline and the multi-agent system warm-start on the same behaviour.
    """
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    episodes = [run_expert_episode(q, tools, errors, rng)
                for q in pick_questions(bench, split, n, stage, seed)]
    rows = [json.dumps(inline_records(ep), sort_keys=True, ensure_ascii=False)
            for ep in episodes]
    (root / f"{INLINE_AGENT}.jsonl").write_text("".join(r + "\n" for r in rows),
                                                encoding="utf-8")
    summary = {"episodes": len(episodes), "split": split, "stage": stage, "seed": seed,
               "inline": True, "accuracy": sum(ep.correct for ep in episodes) / len(episodes),
               "records": {INLINE_AGENT: len(rows)}, "errors": error_chances(episodes),
               "error_rates": errors.model_dump()}
    (root / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n",
                                       encoding="utf-8")
    return summary
