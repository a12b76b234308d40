"""One real turn_team round (embedded, the tiny model, a shared policy) on each of sokoban,
coder_tester and math_team: the worlds plug into the workflow by name, survive the tree
sampler's state copies and whatever the untrained model writes, and the round trains and
evaluates."""

from __future__ import annotations

import csv

import pytest

from mgrpo.envs.worlds import build_world
from mgrpo.training.config import RunConfig
from mgrpo.training.loop import run_training


@pytest.mark.parametrize("world", ["sokoban", "coder_tester", "math_team"])
def test_one_round_trains_on_the_world(tiny_dir, tmp_path, world):
    roles = {role: "m" for role in build_world(world).roles}
    cfg = RunConfig.model_validate({
        "name": world, "out_dir": str(tmp_path / "out"), "k": 2, "queries_per_round": 1,
        "report_to": [], "stages": [{"stage": None, "rounds": 1}], "eval_questions": 1,
        "sampling": {"max_new_tokens": 8}, "models": {"m": {"path": str(tiny_dir)}},
        "workflow": {"kind": "turn_team", "world": world, "roles": roles, "alpha": 1.0,
                     "max_turns": 1, "train_tasks": 4}})
    result = run_training(cfg, progress=False)
    assert result.rounds == 1 and "eval/greedy/accuracy" in result.after
    with open(tmp_path / "out" / "metrics.csv") as f:
        keys = {row["key"] for row in csv.DictReader(f)}
    assert {"team/accuracy", "m/entropy"} | {f"{role}/samples" for role in roles} <= keys
