"""The sokoban world: seeded disjoint splits, solvable tasks, the BFS expert, local rewards,
and hostile actions that end as low-reward turns (never an exception or a hang)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from mgrpo.envs.worlds import WorldTask, build_world, world_names
from mgrpo.envs.worlds.kit import split_of
from mgrpo.envs.worlds.sokoban import Board, parse_moves, solve


@pytest.fixture(scope="module")
def world():
    from mgrpo.sandbox.local import LocalSandbox

    return build_world("sokoban", sandbox=LocalSandbox(), timeout_s=1.0)


def play_expert(world, task):
    state = world.reset(task)
    while not state.done:
        for role in world.roles:
            if not state.done:
                world.act(state, role, world.expert_action(state, role))
    return state


def corridor(grid: list[str]) -> WorldTask:
    return WorldTask(task_id="t", split="test", statement="Board:\n" + "\n".join(grid),
                     solution=solve(grid), data={"grid": grid, "boxes": 1})


def as_json(tasks) -> str:
    return json.dumps([dataclasses.asdict(t) for t in tasks], sort_keys=True)


def test_registered_with_its_roles(world):
    assert "sokoban" in world_names()
    assert world.roles == ("tool", "plan") and world.max_turns == 3


def test_the_same_seed_gives_byte_identical_tasks_and_splits_are_disjoint(world):
    assert as_json(world.tasks("train", 40, seed=3)) == as_json(world.tasks("train", 40, seed=3))
    assert as_json(world.tasks("train", 40, seed=3)) != as_json(world.tasks("train", 40, seed=4))
    grids = {s: {"\n".join(t.data["grid"]) for t in world.tasks(s, n, seed=0)}
             for s, n in (("train", 150), ("dev", 20), ("test", 20))}
    assert len(grids["train"]) == 150 and len(grids["test"]) == 20
    assert not grids["train"] & grids["test"] and not grids["train"] & grids["dev"]
    assert not grids["dev"] & grids["test"]
    assert all(split_of(g) == s for s, found in grids.items() for g in found)


def test_every_task_is_solvable_by_its_solution_which_is_shortest(world):
    for task in world.tasks("dev", 20, seed=1):
        board = Board(task.data["grid"])
        assert not board.solved() and len(task.solution) >= 3
        assert board.play(list(task.solution)) == len(task.solution) and board.solved()
        assert len(solve(task.data["grid"])) == len(task.solution)
        assert 6 <= board.height <= 7 and 1 <= len(board.boxes) == len(board.targets) <= 2


def test_the_expert_solves_every_test_task_in_one_team_turn(world):
    for task in world.tasks("test", 12, seed=0):
        state = play_expert(world, task)
        assert world.score(state) == 1.0, task.task_id
        assert [t.reward for t in state.turns] == [1.0, 1.0]
        assert state.team_turn == 1
        assert len(state.data["tool_output"]) == len(task.solution)  # a shortest solution


def test_plan_rewards_legal_moves_and_progress_and_stops_at_an_illegal_move(world):
    task = corridor(["######", "#@$_.#", "######"])
    state = world.reset(task)
    turn = world.act(state, "plan", "R L")  # R pushes the box 1 closer; L is legal
    assert turn.reward == pytest.approx(0.2 * 2 / 2 + 0.4 * 0.5)
    assert state.data["grid"][1] == "#@_$.#"
    turn = world.act(state, "plan", "U R")  # U is into a wall: nothing moves
    assert turn.reward == 0.0 and "move 1 (U) is illegal" in turn.feedback
    assert state.data["grid"][1] == "#@_$.#"
    turn = world.act(state, "plan", "<answer>right right")  # the stop marker left out
    assert turn.reward == 1.0 and world.score(state) == 1.0 and state.done


def test_out_of_turns_ends_the_episode_unsolved(world):
    state = world.reset(corridor(["######", "#@$_.#", "######"]))
    for _ in range(world.max_turns):
        world.act(state, "tool", "print('no idea')")
        world.act(state, "plan", "L")
    assert state.done and world.score(state) == 0.0 and state.team_turn == 3
    with pytest.raises(ValueError, match="episode is over"):
        world.act(state, "tool", "print(1)")


@pytest.mark.parametrize("garbage", ["hello world", "", "```\n```", "<moves>X Y</moves>",
                                     "\ud800\x00" * 50])
def test_garbage_plans_get_zero_and_a_clear_feedback(world, garbage):
    task = world.tasks("test", 1, seed=0)[0]
    state = world.reset(task)
    turn = world.act(state, "plan", garbage)
    assert turn.reward == 0.0 and "could not read moves" in turn.feedback
    assert state.data["grid"] == task.data["grid"] and not state.done


def test_tool_output_is_scored_and_shown_to_the_plan_agent(world):
    state = world.reset(corridor(["######", "#@$_.#", "######"]))
    turn = world.act(state, "tool", "<tool>print(len(GRID))\nprint('R R')</tool>")
    assert turn.reward == 1.0 and state.data["tool_output"] == "3\nR R"
    assert "Tool output: 3\nR R" in world.observe(state, "plan")
    assert world.act(state, "plan", "garbage").reward == 0.0
    assert world.act(state, "tool", "print('R')").reward == 0.5  # legal, not solved
    assert world.act(state, "plan", "R").reward == pytest.approx(0.2 + 0.4 * 0.5)
    assert world.act(state, "tool", "print('L L')").reward == 0.2  # 2nd L into the wall


@pytest.mark.parametrize("code,error", [
    ("while True:\n    pass", "timeout"),
    ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)", "Error"),
    ("raise SystemExit(3)", "exit code 3"),
    ("x = '\ud800'", "not valid unicode"),
    ("def f(:", "SyntaxError"),
])
def test_hostile_or_broken_tool_code_is_a_zero_reward_turn(world, code, error):
    state = world.reset(world.tasks("test", 1, seed=0)[0])
    start = time.monotonic()
    turn = world.act(state, "tool", code)
    assert time.monotonic() - start < 5
    assert turn.reward == 0.0 and error in turn.feedback, turn.feedback
    assert state.data["tool_output"] == turn.feedback


def test_tool_code_reading_a_host_file_gets_no_moves_reward(world):
    state = world.reset(world.tasks("test", 1, seed=0)[0])
    turn = world.act(state, "tool", f"print(open({__file__!r}).read())")
    assert turn.reward <= 0.2


def test_parse_moves_reads_the_usual_spellings_and_refuses_the_rest():
    assert parse_moves("R R D") == parse_moves("rrd") == parse_moves("right, right, down") \
        == parse_moves("I think <moves>RRD</moves>") == ["R", "R", "D"]
    assert parse_moves("move R") is None and parse_moves("   ") is None


def test_unknown_roles_and_worlds_are_refused_by_name(world):
    with pytest.raises(ValueError, match="roles: tool, plan"):
        world.observe(world.reset(world.tasks("test", 1, seed=0)[0]), "coder")
    with pytest.raises(ValueError, match="valid: .*sokoban"):
        build_world("sokoban2")
    with pytest.raises(ValueError, match="unknown split"):
        world.tasks("valid", 1, seed=0)
