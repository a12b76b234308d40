"""`mgrpo eval` on a turn team: the turn team's runner (``mgrpo.training.runners``) on tasks of
its world's split, the same numbers as ``team_round.evaluate_team`` (what `mgrpo train` and
the team ablation evaluate with), the scripted expert solving every task, the run's
checkpoints, and the hierarchy's options refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from training_testkit import ScriptedEngine
from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.envs.worlds import build_world
from mgrpo.training import team_round
from mgrpo.training.config import RunConfig

ROLES = {"math_team": {"tool_user": "a", "reasoner": "b"},
         "plan_path": {"tool": "a", "plan": "b"}}
# A phrase of each role's observation, to tell the roles apart in a prompt.
ASKS = {"tool_user": "You are the tool user", "reasoner": "You are the reasoner",
        "tool": "You are the tool agent", "plan": "You are the plan agent"}


def _config(tmp_path, tiny_dir, world: str, **flow) -> str:
    path = tmp_path / f"{world}.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "out_dir": str(tmp_path / "run"), "report_to": [], "k": 2, "seed": 3,
        "sampling": {"max_new_tokens": 8},
        "models": {m: {"path": str(tiny_dir)} for m in ("a", "b")},
        "workflow": {"kind": "turn_team", "world": world, "roles": ROLES[world], **flow}}))
    return str(path)


def _eval(*args: str) -> dict:
    res = CliRunner().invoke(app, ["eval", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


@pytest.mark.parametrize("world", ["math_team", "plan_path"])
def test_eval_cli_equals_the_team_evaluation(tmp_path, tiny_dir, world):
    config = _config(tmp_path, tiny_dir, world, max_turns=1)
    out = _eval("--config", config, "--n", "2", "--out", str(tmp_path / "eval.json"))
    roles = tuple(ROLES[world])
    assert out["world"] == world and out["split"] == "test" and out["tasks"] == 2
    assert out["seed"] == 3 and out["decoding"] == "greedy"
    assert out["roles"] == ROLES[world] and out["weights"] == "models' paths"
    assert out["models"] == {"a": str(tiny_dir), "b": str(tiny_dir)}
    keys = {"accuracy", "team_reward", "team_turns"} | {
        f"{r}/{q}" for r in roles for q in ("turn_reward", "local_reward", "malformed", "turns")}
    assert {k for k in out if k.startswith("eval/")} == {f"eval/greedy/{k}" for k in keys}
    assert json.loads((tmp_path / "eval.json").read_text()) == out
    # the function mgrpo train evaluates with, on the same tasks and seed: the same numbers
    cfg = RunConfig.model_validate(yaml.safe_load(Path(config).read_text()))
    system = team_round.build_team_system(cfg)
    tasks = system.world.tasks("test", 2, 3)
    expected = team_round.evaluate_team(system, tasks)
    assert {k: out[k] for k in expected} == expected
    assert out["eval/greedy/team_turns"] == 1.0  # one team turn at most, unsolved or solved
    for role in roles:
        assert out[f"eval/greedy/{role}/turns"] == 1.0
        assert 0.0 <= out[f"eval/greedy/{role}/malformed"] <= 1.0


def _expert_engines(monkeypatch, world_name: str, calls: list):
    """Each role's engine writes the world's scripted expert action for the task in its
    prompt (found by its statement), recording the requests' temperatures."""
    world = build_world(world_name)
    tasks = world.tasks("test", 3, 3)
    build = team_round.build_team_system

    def build_expert(cfg, *args, **kwargs):
        system = build(cfg, *args, **kwargs)
        for role, runtime in system.runtimes.items():
            tok = runtime.tokenizer

            def respond(prompt, params, role=role, tok=tok):
                text = tok.decode(prompt)
                assert ASKS[role] in text
                task = next(t for t in tasks if t.statement in text)
                calls.append(params.temperature)
                return tok.encode(world.expert_action(world.reset(task), role),
                                  add_special_tokens=False)

            runtime.engine = ScriptedEngine(tok, respond)
        return system

    monkeypatch.setattr(team_round, "build_team_system", build_expert)


@pytest.mark.parametrize("world", ["math_team", "plan_path"])
def test_the_scripted_expert_solves_every_task(tmp_path, tiny_dir, monkeypatch, world):
    calls: list[float] = []
    _expert_engines(monkeypatch, world, calls)
    config = _config(tmp_path, tiny_dir, world)
    out = _eval("--config", config, "--n", "3")
    assert out["eval/greedy/accuracy"] == 1.0 and out["eval/greedy/team_reward"] == 1.0
    assert out["eval/greedy/team_turns"] == 1.0  # solved in the first team turn
    for role in ROLES[world]:
        assert out[f"eval/greedy/{role}/malformed"] == 0.0
        assert out[f"eval/greedy/{role}/turns"] == 1.0
    # the expert's answer earns the answering role local 1 and team 1 (alpha 1: turn 2)
    answerer = list(ROLES[world])[-1]
    assert out[f"eval/greedy/{answerer}/local_reward"] == 1.0
    assert out[f"eval/greedy/{answerer}/turn_reward"] == 2.0
    assert calls == [0.0] * 6  # greedy: one request per role and task
    calls.clear()
    sampled = _eval("--config", config, "--n", "3", "--no-greedy")
    assert sampled["decoding"] == "sampled" and sampled["eval/sampled/accuracy"] == 1.0
    assert not any(k.startswith("eval/greedy/") for k in sampled)
    assert calls == [1.0] * 6  # one sampled action (not K) per role and task


def test_checkpoints_and_refused_options(tmp_path, tiny_dir):
    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import save_checkpoint
    from mgrpo.training.run_state import checkpoint_root

    config = _config(tmp_path, tiny_dir, "math_team", max_turns=1)
    runner = CliRunner()
    none = runner.invoke(app, ["eval", "--config", config, "--n", "1", "--checkpoints"])
    assert none.exit_code == 1 and "no checkpoints" in none.output
    cfg = RunConfig.model_validate(yaml.safe_load(Path(config).read_text()))
    net, tokenizer = load_model(str(tiny_dir), device="cpu")
    save_checkpoint(net, checkpoint_root(cfg), "a", 3, tokenizer=tokenizer)
    out = _eval("--config", config, "--n", "1", "--checkpoints")
    assert out["weights"] == {"a": "t v3"}  # b never checkpointed: its path's weights
    for option, value in (("--bench-seed", "2"), ("--subagent", "coder"), ("--stage", "1"),
                          ("--episodes", "2")):
        res = runner.invoke(app, ["eval", "--config", config, option, value])
        assert res.exit_code == 1
        line = res.output.splitlines()[0]
        assert line.startswith(f"error: mgrpo eval {option}: workflow turn_team has no")
    bad = runner.invoke(app, ["eval", "--config", config, "--split", "val"])
    assert bad.exit_code == 1 and "a world's splits are train, dev, test" in bad.output


def test_worlds_mark_malformed_actions():
    math = build_world("math_team")
    state = math.reset(math.tasks("test", 1, 0)[0])
    assert math.act(state, "tool_user", "import os").malformed
    assert not math.act(state, "reasoner", "<answer>7</answer>").malformed
    state = math.reset(state.task)
    assert not math.act(state, "tool_user", "<tool>1 + 2</tool>").malformed
    assert math.act(state, "reasoner", "I think 7").malformed
    plan = build_world("plan_path")
    state = plan.reset(plan.tasks("test", 1, 0)[0])
    assert plan.act(state, "tool", "no code here").malformed
    assert plan.act(state, "plan", "RR").malformed
    assert not plan.act(state, "plan", "<answer>RR</answer>").malformed


def test_accuracy_counts_solved_tasks_and_team_reward_averages_scores():
    """coder_tester's team reward is the share of hidden tests passed: a task half passed
    counts 0.5 in the team reward and 0 in the accuracy."""
    from mgrpo.envs.worlds import WorldState, WorldTask
    from mgrpo.training.team_play import TeamEpisode

    class Half:
        def score(self, state):
            return state.data["passed"]

    task = WorldTask("x", "test", "", None)
    episodes = [TeamEpisode(task, WorldState(task, data={"passed": p, "team_turn": t}))
                for p, t in ((1.0, 1), (0.5, 3))]
    assert team_round.team_metrics(episodes, Half(), "eval/greedy") == {
        "eval/greedy/accuracy": 0.5, "eval/greedy/team_reward": 0.75,
        "eval/greedy/team_turns": 2.0}
