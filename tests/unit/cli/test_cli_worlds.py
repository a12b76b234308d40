"""`mgrpo worlds list` shows every registered world with its roles and turn limit; `mgrpo
worlds expert` plays the scripted expert and prints its solve rate as one JSON line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mgrpo.cli.main import app


def test_worlds_list_shows_each_world_its_roles_and_turn_limit():
    result = CliRunner().invoke(app, ["worlds", "list"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()}
    assert "roles: tool, plan " in lines["sokoban"] and "max_turns: 3" in lines["sokoban"]
    assert "roles: tester, coder " in lines["coder_tester"]
    assert "roles: tool_user, reasoner " in lines["math_team"]


def test_worlds_expert_prints_the_solve_rate():
    result = CliRunner().invoke(app, ["worlds", "expert", "math_team", "--n", "20",
                                      "--split", "dev", "--seed", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report == {"world": "math_team", "split": "dev", "n": 20, "seed": 3, "solved": 1.0,
                      "mean_team_reward": 1.0, "mean_team_turns": 1.0}


def test_a_world_that_needs_options_is_listed_with_the_reason(monkeypatch):
    from mgrpo.envs.worlds import base

    def needy(*, size: int):
        raise AssertionError("never built")

    monkeypatch.setattr(base.WORLDS, "_entries", dict(base.WORLDS._entries))  # gone after
    base.register_world("needs_size_cli_test", needy)
    result = CliRunner().invoke(app, ["worlds", "list"])
    assert result.exit_code == 0, result.output
    assert "needs_size_cli_test" in result.output and "needs options to build" in result.output


def test_worlds_demos_builds_the_world_with_its_options(tmp_path):
    out = tmp_path / "demos.jsonl"
    args = ["worlds", "demos", "plan_path", "--n", "3", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--options", '{"grid_input": true}'])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    tool = [r["segments"] for r in rows if r["agent"] == "tool"]
    assert len(tool) == 3 and all("g = grid\n" in s[1]["text"] for s in tool)
    assert all("`grid` defined" in s[0]["text"] for s in tool)
    refused = CliRunner().invoke(app, [*args, "--options", '{"grid_imput": true}'])
    assert refused.exit_code != 0 and "grid_imput" in refused.output
    assert CliRunner().invoke(app, [*args, "--options", "[1]"]).exit_code != 0
