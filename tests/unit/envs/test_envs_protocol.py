"""The protocol: exact header text, strict turn parsing, fuzzing, trajectory format checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo import protocol_tokens as T
from mgrpo.envs import protocol as P


def test_headers_are_exact():
    assert P.planner_header("How big is Varnholt?") == (
        "<|agents|>searcher: look up facts; coder: run python"
        "<|question|>How big is Varnholt?<|planner|>")
    assert P.subagent_header("searcher", "population of Varnholt") == \
        "<|task|>population of Varnholt<|searcher|>"
    assert P.render_ret("48213") == "<ret>48213</ret>"
    assert P.render_obs("a</obs><call>x|y</call>") == "<obs>ax|y</obs>"  # cannot forge turns
    with pytest.raises(ValueError, match="Bad Role"):
        P.subagent_header("Bad Role", "t")


@pytest.mark.parametrize("text, kind, agent, task, answer", [
    ("<call>searcher|population of Varnholt</call>", "call", "searcher",
     "population of Varnholt", None),
    ("<call>coder|48213 - 31002</call><|end|>", "call", "coder", "48213 - 31002", None),
    ("  <answer>48213</answer> ", "answer", None, None, "48213"),
    ("<call>coder|a|b</call>", "call", "coder", "a|b", None),
])
def test_planner_valid_turns(text, kind, agent, task, answer):
    action = P.parse_planner_turn(text)
    assert (action.kind, action.agent, action.task, action.answer, action.error) == \
        (kind, agent, task, answer, None)


@pytest.mark.parametrize("text, why", [
    ("", "exactly"),
    ("48213", "exactly"),
    ("<answer>48213", "exactly"),
    ("<answer>48213</answer> trailing", "exactly"),
    ("think first <answer>1</answer>", "exactly"),
    ("<answer>  </answer>", "empty"),
    ("<answer>1</answer><answer>2</answer>", "marker"),
    ("<call>searcher</call>", "agent|task"),
    ("<call>Searcher|x</call>", "agent|task"),
    ("<call>searcher|</call>", "agent|task"),
    ("<call>searcher|<ret>x</call>", "marker"),
    ("<tool>x</tool>", "exactly"),
    ("<answer>1</answer><|end|><|end|>", "exactly"),
])
def test_planner_invalid_turns_say_why(text, why):
    action = P.parse_planner_turn(text)
    assert action.kind == "invalid" and why in action.error


def test_planner_unknown_agent():
    action = P.parse_planner_turn("<call>oracle|x</call>", agents=["searcher", "coder"])
    assert action.kind == "invalid" and "unknown agent 'oracle'" in action.error


def test_subagent_turns():
    assert P.parse_subagent_turn("<tool>print(3 < 4 | 1)</tool>") == \
        P.SubagentAction("tool", payload="print(3 < 4 | 1)")
    assert P.parse_subagent_turn("<return>1596</return><|end|>") == \
        P.SubagentAction("return", payload="1596")
    multi = P.parse_subagent_turn("<tool>x = 1\nprint(x)</tool>")
    assert multi.kind == "tool" and multi.payload == "x = 1\nprint(x)"
    for bad in ("<return></return>", "<tool>a<obs>b</tool>", "<answer>1</answer>", "tool"):
        assert P.parse_subagent_turn(bad).kind == "invalid"


_ATOMS = st.sampled_from([*T.SPECIAL_TOKENS, "|", "searcher", "coder", " ", "x", "48213",
                          "<", ">", "/", "\n", "é", "\x00"])


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=60), st.lists(_ATOMS, max_size=12).map("".join)))
def test_parsers_never_raise_and_round_trip(text):
    for action in (P.parse_planner_turn(text), P.parse_subagent_turn(text)):
        assert action.kind in ("call", "answer", "tool", "return", "invalid")
        assert (action.kind == "invalid") == (action.error is not None)
    planner = P.parse_planner_turn(text)
    if planner.kind == "call":  # a valid turn re-renders to a turn that parses the same
        assert P.parse_planner_turn(P.render_call(planner.agent, planner.task)) == planner
    if planner.kind == "answer":
        assert P.parse_planner_turn(P.render_answer(planner.answer)) == planner


@given(st.one_of(st.none(), st.integers(), st.binary()))
def test_parsers_take_non_text(value):
    assert P.parse_planner_turn(value).kind == "invalid"
    assert P.parse_subagent_turn(value).kind == "invalid"


def test_trajectory_format():
    call, ans = P.PlannerAction("call", "searcher", "t"), P.PlannerAction("answer", answer="1")
    bad = P.PlannerAction("invalid", error="x")
    assert P.planner_format_ok([call, call, ans], max_turns=8)
    assert P.planner_format_ok([ans], max_turns=1)
    assert not P.planner_format_ok([], max_turns=8)
    assert not P.planner_format_ok([call], max_turns=8)  # never answered
    assert not P.planner_format_ok([call, bad, ans], max_turns=8)
    assert not P.planner_format_ok([ans, ans], max_turns=8)
    assert not P.planner_format_ok([call] * 8 + [ans], max_turns=8)
    assert P.planner_format_ok([call] * 8 + [ans], max_turns=9)
    tool, ret = P.SubagentAction("tool", "q"), P.SubagentAction("return", "r")
    assert P.subagent_format_ok([tool, ret], max_turns=2)
    assert P.subagent_format_ok([ret], max_turns=1)
    assert not P.subagent_format_ok([tool, tool, tool, tool, ret], max_turns=4)
    assert P.subagent_format_ok([tool, tool, tool, tool, ret], max_turns=5)
    assert not P.subagent_format_ok([tool], max_turns=4)
