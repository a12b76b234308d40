"""The math_team world: seeded disjoint arithmetic questions, the safe evaluator as the tool,
exact-match verdicts, local rewards, and garbage that ends as a zero-reward turn."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mgrpo.envs.arith import evaluate_arithmetic
from mgrpo.envs.worlds import WorldTask, build_world
from mgrpo.envs.worlds.math_team import normalize


@pytest.fixture(scope="module")
def world():
    return build_world("math_team")


def compare_task() -> WorldTask:
    return WorldTask(task_id="c", split="test",
                     statement="Varholt has a population of 48213. Ostby has a population of "
                     "31002.\nQuestion: Which city has the larger population, Varholt or Ostby?",
                     solution="Varholt",
                     data={"kind": "compare", "expression": "48213 > 31002", "value": "True"})


def as_json(tasks) -> str:
    return json.dumps([dataclasses.asdict(t) for t in tasks], sort_keys=True)


def test_the_same_seed_gives_byte_identical_tasks_and_splits_are_disjoint(world):
    assert world.roles == ("tool_user", "reasoner") and world.max_turns == 2
    assert as_json(world.tasks("train", 50, seed=1)) == as_json(world.tasks("train", 50, seed=1))
    assert as_json(world.tasks("train", 50, seed=1)) != as_json(world.tasks("train", 50, seed=2))
    found = {s: world.tasks(s, n, seed=0) for s, n in (("train", 200), ("dev", 20),
                                                       ("test", 200))}
    texts = {s: {t.statement for t in ts} for s, ts in found.items()}
    assert [len(v) for v in texts.values()] == [200, 20, 200]
    assert not texts["train"] & texts["test"] and not texts["dev"] & (texts["train"]
                                                                       | texts["test"])
    assert {t.data["kind"] for t in found["test"]} == {"compare", "arith", "founder_age"}
    for task in found["test"]:  # every gold answer follows from its gold expression
        value = evaluate_arithmetic(task.data["expression"])
        assert value == task.data["value"]
        if task.data["kind"] != "compare":
            assert task.solution == value and int(value) > 0
        else:
            assert task.solution in task.statement.split("Question: ")[1]


def test_the_expert_answers_every_test_question(world):
    for task in world.tasks("test", 200, seed=0):
        state = world.reset(task)
        for role in world.roles:
            world.act(state, role, world.expert_action(state, role))
        assert state.done and world.score(state) == 1.0, task.task_id
        assert [t.reward for t in state.turns] == [1.0, 1.0]


@pytest.mark.parametrize("expression,reward", [
    ("<tool>48213 > 31002</tool>", 1.0), ("<expr>48213>31002</expr>", 1.0),
    ("```\n31002 < 48213\n```", 1.0), ("<tool>31002 < 48213", 1.0),
    ("1 > 0", 0.5), ("48213 < 31002", 0.2), ("9**9**9", 0.0), ("__import__('os')", 0.0),
    ("hello world", 0.0), ("(" * 2000, 0.0), ("", 0.0),
])
def test_tool_user_reward(world, expression, reward):
    state = world.reset(compare_task())
    turn = world.act(state, "tool_user", expression)
    assert turn.reward == reward, turn.feedback
    assert (turn.feedback.startswith("refused:")) == (reward == 0.0)
    shown = state.data["expression"] or "(none)"
    assert f"Tool: {shown} = " in world.observe(state, "reasoner")


def test_the_reasoner_must_tag_its_answer_and_is_judged_by_exact_match(world):
    state = world.reset(compare_task())
    world.act(state, "tool_user", "48213 > 31002")
    turn = world.act(state, "reasoner", "Varholt")
    assert turn.reward == 0.0 and "<answer>" in turn.feedback and not state.done
    world.act(state, "tool_user", "48213 > 31002")
    turn = world.act(state, "reasoner", "So: <answer> varholt. </answer>")
    assert turn.reward == 1.0 and state.done and world.score(state) == 1.0

    state = world.reset(compare_task())
    world.act(state, "tool_user", "48213 > 31002")
    turn = world.act(state, "reasoner", "<answer>Ostby</answer>")
    assert turn.reward == 0.0 and state.done and world.score(state) == 0.0


def test_out_of_turns_without_an_answer_scores_zero(world):
    state = world.reset(compare_task())
    for _ in range(world.max_turns):
        world.act(state, "tool_user", "garbage")
        world.act(state, "reasoner", "\ud800" * 10)
    assert state.done and world.score(state) == 0.0


def test_normalize_ignores_case_spaces_periods_and_thousands_separators():
    assert normalize("  17,211. ") == normalize("17211") == "17211"
    assert normalize("Varholt") == normalize("varholt .") and normalize("1,5") == "1,5"
