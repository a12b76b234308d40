"""The tool + plan worlds (plan_path, sudoku4): seeded, disjoint splits; the expert solves the
test split through the real sandbox; hostile or malformed actions are low-reward turns, never
exceptions; partial credit by hand."""

from __future__ import annotations

import pytest

from mgrpo.envs.worlds import WorldTask, build_world, world_names
from mgrpo.envs.worlds.plan_path import PlanPath

WORLDS = ["plan_path", "sudoku4"]


def _play_expert(world, task):
    state = world.reset(task)
    while not state.done:
        for role in world.roles:
            world.act(state, role, world.expert_action(state, role))
    return state


def test_both_worlds_are_registered():
    assert set(WORLDS) <= set(world_names())


@pytest.mark.parametrize("name", WORLDS)
def test_same_seed_same_tasks_and_disjoint_splits(name):
    world = build_world(name)
    first, again = world.tasks("train", 40, seed=3), world.tasks("train", 40, seed=3)
    assert [t.statement for t in first] == [t.statement for t in again]
    assert [t.task_id for t in first] == [t.task_id for t in again]
    other = world.tasks("train", 40, seed=4)
    assert [t.statement for t in other] != [t.statement for t in first]
    train = {t.statement for s in (3, 4) for t in world.tasks("train", 200, seed=s)}
    test = {t.statement for s in (3, 4) for t in world.tasks("test", 60, seed=s)}
    dev = {t.statement for t in world.tasks("dev", 20, seed=3)}
    assert len(train) > 200 and len(test) > 60
    assert not train & test and not train & dev and not dev & test
    assert len({t.statement for t in first}) == 40  # distinct within a split


@pytest.mark.parametrize("name", WORLDS)
def test_expert_solves_the_test_split_through_the_sandbox(name):
    world = build_world(name)
    tasks = world.tasks("test", 20, seed=0)
    states = [_play_expert(world, t) for t in tasks]
    solved = sum(world.score(s) for s in states)
    assert solved / len(tasks) >= 0.95
    first = states[0].turns
    assert [t.role for t in first] == ["tool", "plan"] and first[0].reward == 1.0
    assert first[1].reward == 1.0 and states[0].team_turn == 1


@pytest.mark.parametrize("name", WORLDS)
@pytest.mark.parametrize("role,action", [
    ("tool", "<tool>while True: pass</tool>"),
    ("tool", "<tool>raise SystemExit(3)</tool>"),
    ("tool", "<tool>print('x' * 10**7)</tool>"),
    ("tool", "<tool>\ud800</tool>"),
    ("tool", "no markers at all"),
    ("plan", "<answer>" + "U" * 5000 + "</answer>"),
    ("plan", "<answer>DROP TABLE; \x00</answer>"),
    ("plan", "garbage " * 2000),
    ("plan", ""),
])
def test_hostile_or_malformed_actions_score_low_without_raising(name, role, action):
    world = build_world(name, timeout_s=0.5)
    state = world.reset(world.tasks("test", 1, seed=0)[0])
    if role == "plan":
        world.act(state, "tool", "<tool>print(1)</tool>")
    turn = world.act(state, role, action)
    assert 0.0 <= turn.reward <= 0.2 and turn.feedback
    assert world.score(state) == 0.0 and not state.data["solved"]
    assert world.observe(state, "plan").startswith(state.task.statement)


def test_plan_path_partial_credit_by_hand():
    world = PlanPath()
    task = WorldTask("hand", "train", "", "RRDD", {"grid": ["S..", ".#.", "..G"]})
    assert world.check(task, "RRDD") == (1.0, True, "reached G")
    assert world.check(task, "r, r d d") == (1.0, True, "reached G")
    assert world.check(task, "RR") == (0.25, False, "did not end on G")  # 0.5 * 2/4 closed
    assert world.check(task, "DR") == (0.125, False, "hit a wall or the edge")  # stops at D
    assert world.check(task, "RRDDX")[0] == 0.0
    assert world.check(task, "")[0] == 0.0


def test_sudoku4_accepts_any_valid_fill_and_refuses_changed_givens():
    world = build_world("sudoku4")
    task = world.tasks("test", 1, seed=0)[0]
    assert world.check(task, task.solution)[:2] == (1.0, True)
    givens = "".join(task.data["puzzle"])
    at = next(i for i, g in enumerate(givens) if g != "0")
    flat = task.solution.replace(" ", "")
    changed = flat[:at] + str(int(flat[at]) % 4 + 1) + flat[at + 1:]
    assert world.check(task, changed) == (0.0, False, "changes a given digit")
    other = WorldTask("hand", "train", "", "", {"puzzle": ["0000"] * 4})  # many solutions
    assert world.check(other, "2143 4321 1234 3412")[:2] == (1.0, True)
    assert world.check(other, "1234 1234 1234 1234") == (0.5 * 4 / 12, False,
                                                         "4/12 units hold 1-4")
    assert world.check(task, "1234")[0] == 0.0


def test_expert_demos_are_sft_examples_of_each_turn(tmp_path):
    from typer.testing import CliRunner

    from mgrpo.cli.main import app
    from mgrpo.models.sft import load_sft_jsonl

    path = tmp_path / "demos.jsonl"
    done = CliRunner().invoke(app, ["worlds", "demos", "plan_path", "--out", str(path),
                                    "--n", "3", "--seed", "1"])
    assert done.exit_code == 0, done.output
    assert '"examples": 6, "per_role": {"tool": 3, "plan": 3}' in done.output
    examples = load_sft_jsonl(path)
    world = build_world("plan_path")
    task = world.tasks("train", 3, seed=1)[0]
    first, second = examples[0], examples[1]
    assert first.agent == "tool" and second.agent == "plan"
    assert first.segments[0].text == world.observe(world.reset(task), "tool")
    assert [s.train for s in first.segments] == [False, True]
    assert first.segments[1].text.startswith("<tool>") and "deque" in first.segments[1].text
    answer = second.segments[1].text
    assert answer.startswith("<answer>") and world.check(task, answer[8:-9])[1]
