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

    monkeypatch.setitem(base._WORLDS, "needs_size_cli_test", needy)  # gone after the test
    result = CliRunner().invoke(app, ["worlds", "list"])
    assert result.exit_code == 0, result.output
    assert "needs_size_cli_test" in result.output and "needs options to build" in result.output
