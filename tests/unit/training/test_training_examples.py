"""The run configs under ``examples/`` load and validate (strictly: a stale key fails), and
the embedded one trains a round on tiny models with its own settings, paths swapped."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mgrpo.training.config import RunConfig
from mgrpo.training.config_files import load_run_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXPECTED = {"embedded.yaml": "mgrpo", "distributed.yaml": "mgrpo", "at_grpo.yaml": "at_grpo",
            "single_agent.yaml": "grpo", "bring_your_own_model.yaml": "mgrpo",
            "turn_team.yaml": "at_grpo", "real_smollm2.yaml": "mgrpo"}
# Demo recipes (DemoConfig, `mgrpo demo --config`), checked in test_training_demo_config.py.
DEMO_CONFIGS = {"demo_full.yaml", "ablate_stage1_462.yaml", "ablate_stage2.yaml"}
# Turn-team ablations (`mgrpo ablate --config`), checked in test_training_team_ablate.py.
TEAM_ABLATIONS = {p.name for p in EXAMPLES.glob("ablate_team_*.yaml")}


def test_every_example_is_listed():
    listed = {*EXPECTED, *DEMO_CONFIGS, *TEAM_ABLATIONS}
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(listed)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_loads_and_validates(name):
    cfg = load_run_config(EXAMPLES / name)
    assert isinstance(cfg, RunConfig) and cfg.algorithm == EXPECTED[name]
    # relative to the file's folder: the repository's runs/, what README "Beyond the demo"
    # builds
    runs = EXAMPLES.parent / "runs"
    assert Path(cfg.out_dir).parent == runs and cfg.name
    if cfg.flow.name == "turn_team":  # a world's tasks, a fresh tiny model (its comment)
        assert all(m.path == str(runs / "tiny") for m in cfg.models.values())
        return
    assert cfg.bench_dir == str(runs / "bench")
    if name == "real_smollm2.yaml":  # make demo-real's warm starts
        assert all(Path(m.path).is_relative_to(runs / "real" / "ckpt")
                   for m in cfg.models.values())
    elif name != "bring_your_own_model.yaml":  # the rest use the README's checkpoints
        assert all(Path(m.path).is_relative_to(runs / "ckpt") for m in cfg.models.values())


def test_distributed_example_starts_a_scoring_trainer_for_the_frozen_coder():
    from mgrpo.cli.up import service_commands

    names = [n for n, _ in service_commands(str(EXAMPLES / "distributed.yaml"), 8000)]
    assert names == ["planner", "planner-worker", "subagent-searcher", "subagent-coder",
                     "trainer-planner", "trainer-searcher", "trainer-coder"]


def test_embedded_example_trains_one_round(tmp_path, tiny_dir, bench_dir):
    from mgrpo.training.loop import run_training

    data = yaml.safe_load((EXAMPLES / "embedded.yaml").read_text())
    overrides = {f"models.{m}.path": str(tiny_dir) for m in data["models"]}
    overrides.update({"bench_dir": str(bench_dir), "out_dir": str(tmp_path / "run"),
                      "stages": [{"stage": 1, "rounds": 1}], "eval_questions": 2,
                      "sampling.max_new_tokens": 6, "sampling.planner_max_turns": 2})
    cfg = load_run_config(EXAMPLES / "embedded.yaml", overrides)
    assert (cfg.k, cfg.queries_per_round, cfg.tools) == (4, 4, {"search": {"k": 1}})
    result = run_training(cfg, progress=False)
    assert result.rounds == 1 and "eval/greedy/accuracy" in result.after
