"""Scripted experts through the REAL tools (BM25 search, python in LocalSandbox)."""

from __future__ import annotations

import json
import random

import pytest

from mgrpo.envs import BenchmarkConfig, build_benchmark
from mgrpo.envs import protocol as P
from mgrpo.envs.demos import error_chances, write_demos
from mgrpo.envs.experts import ExpertErrors, plausible_guess, run_expert_episode

ALL_ERRORS = ("planner.skip_delegation=0.3,planner.wrong_agent=0.2,planner.arithmetic_slip=0.4,"
              "searcher.bad_query=0.25,coder.code_slip=0.35")


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_error_free_expert_scores_100_percent(small_bench, local_tools, split):
    rng = random.Random(0)
    episodes = [run_expert_episode(q, local_tools, ExpertErrors(), rng)
                for q in small_bench.questions(split)]
    assert sum(ep.correct for ep in episodes) == len(episodes)
    assert all(not ep.errors for ep in episodes)
    assert {s.agent for ep in episodes for s in ep.subagents} == {"searcher", "coder"}


@pytest.mark.heavy
def test_error_free_expert_scores_100_percent_default_benchmark():
    from mgrpo.sandbox.local import LocalSandbox
    from mgrpo.tools import build_tool

    bench = build_benchmark(BenchmarkConfig(seed=0))
    tools = {"searcher": build_tool("search", corpus=bench.corpus),
             "coder": build_tool("python", executor=LocalSandbox())}
    for split in ("train", "dev", "test"):
        questions = bench.questions(split)
        correct = sum(run_expert_episode(q, tools).correct for q in questions)
        assert correct == len(questions), split


def _parse_all(record):
    parse = P.parse_planner_turn if record["agent"] == "planner" else P.parse_subagent_turn
    return [parse(s["text"]) for s in record["segments"] if s["train"]]


def test_transcripts_are_valid_protocol(small_bench, local_tools):
    rng = random.Random(1)
    errors = ExpertErrors.parse(ALL_ERRORS)
    for q in small_bench.questions("dev"):
        ep = run_expert_episode(q, local_tools, errors, rng)
        for record in ep.sft_records():
            segs = record["segments"]
            assert not segs[0]["train"] and segs[-1]["train"]
            assert all(s["text"] for s in segs)
            actions = _parse_all(record)
            check = P.planner_format_ok if record["agent"] == "planner" else P.subagent_format_ok
            assert check(actions, max_turns=8), record
            stops = T_STOPS[record["agent"] == "planner"]
            assert all(s["text"].endswith(stops) for s in segs if s["train"])
        assert ep.planner.result == ep.answer


T_STOPS = {True: ("</call>", "</answer>"), False: ("</tool>", "</return>")}


def test_example_transcript_is_exact(small_bench, local_tools):
    q = next(q for q in small_bench.questions("test") if q.kind == "arith"
             and len(q.subtasks) == 3)
    ep = run_expert_episode(q, local_tools)
    s0, s1, s2 = q.subtasks
    texts = [s.text for s in ep.planner.segments]
    assert texts == [P.planner_header(q.question),
                     f"<call>searcher|{s0.task}</call>", f"<ret>{s0.answer}</ret>",
                     f"<call>searcher|{s1.task}</call>", f"<ret>{s1.answer}</ret>",
                     f"<call>coder|{s2.task}</call>", f"<ret>{q.answer}</ret>",
                     f"<answer>{q.answer}</answer>"]
    coder = ep.subagents[-1]
    assert [s.text for s in coder.segments] == [
        f"<|task|>{s2.task}<|coder|>", f"<tool>print({s2.task})</tool>",
        f"<obs>{q.answer}</obs>", f"<return>{q.answer}</return>"]


def test_error_rates_realised_within_tolerance(small_bench, local_tools):
    rates = {"planner.skip_delegation": 0.3, "planner.wrong_agent": 0.2,
             "planner.arithmetic_slip": 0.4, "searcher.bad_query": 0.25,
             "coder.code_slip": 0.35}
    rng = random.Random(5)
    errors = ExpertErrors.parse(ALL_ERRORS)
    questions = [q for q in small_bench.questions("train") if q.stage == 2] * 3
    episodes = [run_expert_episode(q, local_tools, errors, rng) for q in questions]
    stats = error_chances(episodes)
    for key, rate in rates.items():
        n, k = stats[key]["chances"], stats[key]["count"]
        assert n >= 60, (key, n)
        tolerance = 4 * (rate * (1 - rate) / n) ** 0.5  # 4 binomial standard deviations
        assert abs(k / n - rate) < tolerance, (key, k, n)
    accuracy = sum(ep.correct for ep in episodes) / len(episodes)
    assert 0.05 < accuracy < 0.6
    skipped = [ep for ep in episodes if "planner.skip_delegation" in ep.errors]
    assert skipped and all(ep.correct == 0.0 and not ep.subagents for ep in skipped)


def test_each_error_type_breaks_the_episode(small_bench, local_tools):
    arith = [q for q in small_bench.questions("train") if q.kind == "arith"][:10]
    for spec in ("planner.arithmetic_slip=1", "coder.code_slip=1", "searcher.bad_query=1",
                 "planner.wrong_agent=1"):
        rng = random.Random(0)
        eps = [run_expert_episode(q, local_tools, ExpertErrors.parse(spec), rng) for q in arith]
        assert sum(ep.correct for ep in eps) <= 1, spec
    ep = run_expert_episode(arith[0], local_tools, ExpertErrors.parse("searcher.bad_query=1"))
    entity = arith[0].subtasks[0].task.partition(" of ")[2]
    assert entity not in ep.subagents[0].segments[1].text  # the query lacks the name


def test_plausible_guess_is_wrong_but_close():
    rng = random.Random(0)
    for _ in range(50):
        guess = plausible_guess("48213", rng)
        assert guess != "48213" and len(guess) == 5 and guess.isdigit()
    name = plausible_guess("Varnholt", rng)
    assert name != "Varnholt" and len(name) == 8
    assert plausible_guess("A", rng, options=["A", "B"]) == "B"


def test_error_spec_parsing():
    errors = ExpertErrors.parse("planner.skip_delegation=0.5, coder.code_slip=0.1")
    assert errors.planner.skip_delegation == 0.5 and errors.coder.code_slip == 0.1
    assert errors.searcher.bad_query == 0.0
    with pytest.raises(ValueError, match="KEY one of"):
        ExpertErrors.parse("planner.typo=0.5")
    with pytest.raises(ValueError, match="not a number"):
        ExpertErrors.parse("planner.wrong_agent=lots")
    with pytest.raises(ValueError):
        ExpertErrors.parse("planner.wrong_agent=1.5")
    with pytest.raises(ValueError, match="did you mean 'planner.skip_delegation'"):
        ExpertErrors.parse("planner.skip_delgation=0.5")
    with pytest.raises(ValueError, match=r"unknown key 'skip_delgation' \(did you mean "
                       r"'skip_delegation'\?\)"):
        ExpertErrors(planner={"skip_delgation": 0.5})


def test_demos_files_sft_format_and_determinism(tmp_path, small_bench, local_tools):
    errors = ExpertErrors.parse("planner.skip_delegation=0.5")
    a = write_demos(small_bench, tmp_path / "a", local_tools, errors, n=60, seed=3)
    write_demos(small_bench, tmp_path / "b", local_tools, errors, n=60, seed=3)
    for name in ("planner.jsonl", "searcher.jsonl", "coder.jsonl", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    lines = (tmp_path / "a" / "planner.jsonl").read_text().splitlines()
    assert len(lines) == 60 == a["episodes"] == a["records"]["planner"]
    for line in lines:
        row = json.loads(line)
        assert list(row) == ["agent", "segments"] and row["agent"] == "planner"
        assert line == json.dumps(row, sort_keys=True, ensure_ascii=False)
        assert all(list(s) == ["text", "train"] for s in row["segments"])
    skip = a["errors"]["planner.skip_delegation"]
    assert skip["chances"] == 60 and 15 <= skip["count"] <= 45
