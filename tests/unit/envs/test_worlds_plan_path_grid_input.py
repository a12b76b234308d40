"""plan_path's ``grid_input``: the tool's program runs with the task's grid defined as
``grid``; the expert's BFS is one text for every task and solves them through the real
sandbox; the preamble is the grid as data only (a hostile program gains nothing the sandbox
does not already allow); off, nothing changes."""

from __future__ import annotations

import ast

import pytest

from mgrpo.envs.worlds import WorldTask, build_world
from mgrpo.envs.worlds.plan_path import PlanPath
from mgrpo.envs.worlds.play import play


def _tool(world, task, code):
    state = world.reset(task)
    return world.act(state, "tool", f"<tool>{code}</tool>"), state


def test_the_expert_is_one_program_that_solves_tasks_through_the_sandbox():
    world = build_world("plan_path", grid_input=True)
    tasks = world.tasks("test", 20, seed=0)
    assert len({world.expert_code(t) for t in tasks}) == 1
    assert "g = grid\n" in world.expert_code(tasks[0]) and "'" not in world.expert_code(tasks[0])
    states = [play(world, t, world.expert_action) for t in tasks]
    assert [world.score(s) for s in states] == [1.0] * 20
    first = states[0].turns
    assert [(t.role, t.reward) for t in first] == [("tool", 1.0), ("plan", 1.0)]
    shown = states[0].data["tool_output"]
    assert first[1].action == f"<answer>{shown}</answer>" and " " in shown
    assert shown.replace(" ", "") == tasks[0].solution
    assert "`grid` defined" in first[0].observation
    assert "`grid` defined" not in first[1].observation


def test_the_program_reads_the_grid_and_rows_are_strings():
    world = PlanPath(grid_input=True)
    task = world.tasks("test", 1, seed=0)[0]
    turn, state = _tool(world, task, "print(len(grid), type(grid[0]).__name__, grid[-1])")
    assert state.data["tool_output"] == f"5 str {task.data['grid'][-1]}"
    assert turn.reward == 0.2 and turn.feedback == "ran"
    # the same program without the option: `grid` is undefined
    turn, state = _tool(PlanPath(), task, "print(grid)")
    assert turn.reward == 0.0 and "NameError" in state.data["tool_output"]


def test_the_preamble_is_the_grid_as_a_literal_whatever_the_rows_hold():
    world = PlanPath(grid_input=True)
    hostile = ["S'); import os; os.system('x') #", '"""\n', "\\", "..G"]
    task = WorldTask("hand", "test", "", "", {"grid": hostile})
    preamble = world.preamble(task)
    assert preamble.startswith("grid = ") and preamble.endswith("\n")
    assert preamble.count("\n") == 1  # one statement: nothing after it runs
    tree = ast.parse(preamble)
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Assign)
    assert ast.literal_eval(tree.body[0].value) == hostile
    turn, state = _tool(world, task, f"print(grid == {hostile!r})")
    assert state.data["tool_output"] == "True"


@pytest.mark.parametrize("code", [
    "print(open('/etc/hostname').read())",
    "import socket; socket.create_connection(('1.1.1.1', 80), timeout=1); print('out')",
    "while True: pass",
])
def test_a_hostile_program_after_the_preamble_is_still_jailed(code):
    world = PlanPath(grid_input=True, timeout_s=0.5)
    task = world.tasks("test", 1, seed=0)[0]
    turn, state = _tool(world, task, code)
    assert turn.reward == 0.0 and state.data["tool_output"].startswith("error:")


def test_off_is_the_world_as_before():
    on, off = PlanPath(grid_input=True), PlanPath()
    task = off.tasks("test", 1, seed=0)[0]
    assert off.preamble(task) == "" and off.tool_note() == ""
    code = off.expert_code(task)
    assert f"g = {task.data['grid']!r}\n" in code and "g = grid" not in code
    assert '"".join(reversed(path))' in code
    assert code.replace(repr(task.data["grid"]), "grid").replace(
        '"".join', '" ".join') == on.expert_code(task)
    state = off.reset(task)
    assert "`grid`" not in off.observe(state, "tool")
    assert on.observe(state, "tool") == off.observe(state, "tool").replace(
        "</tool>.\n", "</tool>.\nYour program starts with `grid` defined: the rows above as "
        "a list of strings.\n")
    assert [t.task_id for t in on.tasks("test", 5, 0)] == [t.task_id for t in off.tasks(
        "test", 5, 0)]


def test_refused_values():
    with pytest.raises(ValueError, match="must be true or false"):
        PlanPath(grid_input=1)
    with pytest.raises(ValueError, match="single agent has no tool"):
        build_world("plan_path_solo", grid_input=True)
    assert build_world("plan_path_solo", grid_input=False).roles == ("plan",)
