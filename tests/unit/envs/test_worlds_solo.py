"""`plan_path_solo`: Plan-Path's tasks, splits and verifier with the plan role alone (no tool
agent, no tool output in its prompt); the expert's answer solves every task."""

from __future__ import annotations

from mgrpo.envs.worlds import build_world, world_names
from mgrpo.envs.worlds.play import play


def test_solo_is_plan_path_without_the_tool_agent():
    solo, team = build_world("plan_path_solo"), build_world("plan_path")
    assert "plan_path_solo" in world_names() and solo.roles == ("plan",)
    tasks = solo.tasks("test", 20, 0)
    assert [t.task_id for t in tasks] == [t.task_id for t in team.tasks("test", 20, 0)]
    state = solo.reset(tasks[0])
    prompt = solo.observe(state, "plan")
    assert "Tool" not in prompt and prompt.startswith(tasks[0].statement)
    assert "You are the plan agent" in prompt
    solved = [solo.score(play(solo, t, solo.expert_action)) for t in tasks]
    assert solved == [1.0] * 20
    state = solo.reset(tasks[0])
    turn = solo.act(state, "plan", "<answer>U</answer>")
    assert turn.index == 0 and state.team_turn == 1 and "Your last answer" in \
        solo.observe(state, "plan")
