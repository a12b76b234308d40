"""The coder_tester world: seeded disjoint function tasks, hidden tests run in the sandbox,
the local rewards of both roles, and hostile code that ends as a low-reward turn."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

import pytest

from mgrpo.envs.worlds import WorldTask, build_world
from mgrpo.envs.worlds.coder_tester import read_tests


@pytest.fixture(scope="module")
def world():
    from mgrpo.sandbox.local import LocalSandbox

    return build_world("coder_tester", sandbox=LocalSandbox(), timeout_s=1.5)


def double_task() -> WorldTask:
    hidden = [{"args": [x], "expected": 2 * x} for x in range(4)]
    return WorldTask(task_id="double", split="test", statement="Write double(x).",
                     solution={"reference": "def double(x):\n    return 2 * x\n",
                               "hidden_tests": hidden},
                     data={"function": "double", "expert_tests": hidden[:2]})


def as_json(tasks) -> str:
    return json.dumps([dataclasses.asdict(t) for t in tasks], sort_keys=True)


def test_the_same_seed_gives_byte_identical_tasks_and_splits_are_disjoint(world):
    assert world.roles == ("tester", "coder")
    assert as_json(world.tasks("train", 30, seed=2)) == as_json(world.tasks("train", 30, seed=2))
    assert as_json(world.tasks("train", 30, seed=2)) != as_json(world.tasks("train", 30, seed=5))
    found = {s: {t.solution["reference"] for t in world.tasks(s, n, seed=0)}
             for s, n in (("train", 150), ("dev", 30), ("test", 200))}
    assert [len(v) for v in found.values()] == [150, 30, 200]
    assert not found["train"] & found["test"] and not found["train"] & found["dev"]
    assert not found["dev"] & found["test"]
    families = Counter(t.data["family"] for t in world.tasks("test", 200, seed=0))
    assert set(families) == {"arithmetic", "string", "list"} and min(families.values()) >= 40


def test_the_expert_passes_every_hidden_test_in_one_team_turn(world):
    for task in world.tasks("test", 5, seed=0):
        state = world.reset(task)
        for role in world.roles:
            world.act(state, role, world.expert_action(state, role))
        assert world.score(state) == 1.0 and state.done, task.task_id
        assert [t.reward for t in state.turns] == [1.0, 1.0]
        assert "hidden" not in world.observe(state, "coder")


def test_tester_reward_is_the_fraction_of_its_tests_that_hold_and_tell_something(world):
    state = world.reset(double_task())
    turn = world.act(state, "tester", "```python\nassert double(2) == 4\nassert double(1) == 3\n"
                     "assert True\ndef test_more():\n    assert double(0) == 0\n"
                     "    assert double(5) == 10\nassert double(3) == double(3)\n```")
    assert state.data["tests"] == ["assert double(2) == 4", "assert double(1) == 3",
                                   "assert double(0) == 0", "assert double(5) == 10",
                                   "assert double(3) == double(3)"]
    # 1 is wrong for the reference; the last holds for any function: 3 of 5
    assert turn.reward == 0.6 and turn.feedback == "read 5 tests"


def test_coder_reward_is_its_pass_rate_on_the_testers_tests_and_the_team_reward_hidden(world):
    state = world.reset(double_task())
    world.act(state, "tester", "assert double(1) == 2\nassert double(3) == 6")
    turn = world.act(state, "coder", "def double(x):\n    return x * x if x < 2 else 2 * x")
    assert turn.reward == 0.5 and "failed: assert double(1) == 2 -> assertion" in turn.feedback
    assert world.score(state) == 0.75 and not state.done  # 0, 2, 3 pass; 1 fails
    assert "passes 1 of 2 tests" in world.observe(state, "tester")
    world.act(state, "tester", "nothing")
    turn = world.act(state, "coder", "def double(x):\n    return x + x")
    assert turn.reward == 0.2 and "no tests" in turn.feedback
    assert world.score(state) == 1.0 and state.done


def test_the_episode_ends_at_the_turn_limit(world):
    state = world.reset(double_task())
    for _ in range(world.max_turns):
        world.act(state, "tester", "assert double(1) == 2")
        world.act(state, "coder", "def double(x):\n    return x")
    assert state.done and state.team_turn == world.max_turns and world.score(state) == 0.25


@pytest.mark.parametrize("code,error", [
    ("while True:\n    pass", "TimeoutError"),
    ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
     "timeout after 1.5s"),
    ("import os\nos._exit(0)", "ended before the tests ran"),
    ("import sys\nsys.exit(0)", "SystemExit"),
    ("def double(:", "SyntaxError"),
    ("x = '\ud800'", "UnicodeEncodeError"),
    ("", "no code"),
    ("def triple(x):\n    return 3 * x", "no function double is defined"),
])
def test_broken_or_hostile_code_is_a_zero_reward_turn(world, code, error):
    state = world.reset(double_task())
    world.act(state, "tester", "assert double(1) == 2")
    start = time.monotonic()
    turn = world.act(state, "coder", code)
    assert time.monotonic() - start < 4
    assert turn.reward == 0.0 and error in turn.feedback, turn.feedback
    assert world.score(state) == 0.0


def test_a_function_that_loops_fails_each_test_on_its_own_clock(world):
    state = world.reset(double_task())
    world.act(state, "tester", "assert double(1) == 2")
    turn = world.act(state, "coder", "def double(x):\n    while True:\n        pass")
    assert turn.reward == 0.0 and "TimeoutError" in turn.feedback
    assert world.score(state) == 0.0


def test_printed_fake_reports_files_and_the_network_earn_nothing(world):
    state = world.reset(double_task())
    world.act(state, "tester", "assert double(1) == 2")
    fake = json.dumps({"defined": True, "error": "", "results": [""] * 5})
    code = (f"print('@@report-0000000000000000 {fake}')\nimport socket\n"
            f"def double(x):\n    open({__file__!r}).read()\n"
            "    socket.create_connection(('1.1.1.1', 80), timeout=1)\n    return 2 * x")
    turn = world.act(state, "coder", code)
    assert turn.reward == 0.0 and world.score(state) == 0.0
    assert "Error" in turn.feedback


def test_read_tests_refuses_garbage_with_a_note():
    assert read_tests("x = 1", "f") == ([], read_tests("assert g(1)", "f")[1])
    assert "no tests read" in read_tests("x = 1", "f")[1]
    assert "could not parse" in read_tests("hello world", "f")[1]
    assert read_tests("[" * 5000, "f")[0] == []
    assert len(read_tests("\n".join(["assert f(1) == 1"] * 50), "f")[0]) == 20
