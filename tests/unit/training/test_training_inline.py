"""Single-agent baseline data: the inline SFT record is token for token what the inline
runner builds when the model replays the expert's turns."""

from __future__ import annotations

import json
import random

import pytest
from training_testkit import ScriptedEngine, fake_logprob, replay_responder

from mgrpo.envs import protocol as P
from mgrpo.envs.experts import ExpertErrors, run_expert_episode
from mgrpo.models.sft import encode_segments, load_sft_jsonl
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeJob, EpisodeRunner
from mgrpo.training.inline import inline_records, write_inline_demos


def _episodes(bench, tools, n=6, errors=None):
    half = n // 2
    questions = bench.questions("train", stage=1)[:half] + bench.questions("train", stage=2)[:half]
    rng = random.Random(3)
    return questions, [run_expert_episode(q, tools, errors, rng) for q in questions]


def test_inline_record_layout(bench, tools):
    _, (ep, *_) = _episodes(bench, tools, n=2)
    record = inline_records(ep)
    texts = [s["text"] for s in record["segments"]]
    assert record["agent"] == "planner"
    assert not any(t.startswith("<ret>") or t.startswith("<|task|>") for t in texts)
    # call, then the sub-agent's tool turn, its observation, its return, ... then the answer
    call = texts.index(next(t for t in texts if t.startswith("<call>")))
    assert texts[call + 1].startswith("<tool>") and texts[call + 2].startswith("<obs>")
    assert texts[call + 3].startswith("<return>") and texts[-1].startswith("<answer>")
    trains = [s["train"] for s in record["segments"]]
    assert trains[call:call + 4] == [True, True, False, True]


@pytest.mark.parametrize("errors", [None, ExpertErrors.parse(
    "planner.wrong_agent=0.5,planner.skip_delegation=0.3,searcher.bad_query=0.5")])
def test_inline_runner_replays_the_record_exactly(bench, tools, tokenizer, errors):
    questions, episodes = _episodes(bench, tools, n=6, errors=errors)
    records = [encode_segments(tokenizer, [_seg(s) for s in inline_records(ep)["segments"]])
               for ep in episodes]
    engine = ScriptedEngine(tokenizer, replay_responder(records))
    runtime = AgentRuntime("planner", "planner", engine, tokenizer)
    runner = EpisodeRunner(runtime, list(P.DEFAULT_AGENTS),
                           SamplingConfig(planner_max_turns=6, subagent_max_turns=3),
                           inline_tools=tools)
    jobs = [EpisodeJob(q, "r0", 0, seed=i) for i, q in enumerate(questions)]
    played = runner.run(jobs)
    for ep, (ids, mask), expert in zip(played, records, episodes, strict=True):
        assert ep.planner.input_ids == ids
        assert ep.planner.response_mask == mask
        assert ep.planner.old_logprobs == [fake_logprob(i) if m else 0.0
                                           for i, m in enumerate(mask)]
        assert ep.answer == expert.answer and ep.format_ok
        assert ep.subagents == []
        assert ep.calls_per_role == {r: sum(s.agent == r for s in expert.subagents)
                                     for r in {s.agent for s in expert.subagents}}


def _seg(segment: dict):
    from mgrpo.models.sft import SFTSegment

    return SFTSegment(**segment)


def test_mismatched_transcript_is_rejected(bench, tools):
    _, (ep, *_) = _episodes(bench, tools, n=2)
    broken = ep.model_copy(update={"subagents": ep.subagents + ep.subagents[:1]})
    with pytest.raises(ValueError, match="1 planner calls|planner calls"):
        inline_records(broken)


def test_write_inline_demos(bench, tools, tmp_path):
    summary = write_inline_demos(bench, tmp_path, tools, ExpertErrors(), n=5, stage=1, seed=1)
    examples = load_sft_jsonl(tmp_path / "planner.jsonl")
    assert summary["records"] == {"planner": 5} and len(examples) == 5
    assert summary["accuracy"] == 1.0  # error rate 0: the expert solves every question
    assert all(e.agent == "planner" for e in examples)
    assert json.loads((tmp_path / "summary.json").read_text())["inline"] is True
