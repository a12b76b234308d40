"""`make demo` and `make demo-full` configs (issue 17.1): the quick demo keeps its one-stage
schedule; demo-full is a curriculum (stage 1, then stage 2) evaluated on stage 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from mgrpo.experiments.demo import DemoConfig, run_config
from mgrpo.training.config import RunConfig

ROOT = Path(__file__).resolve().parents[3]
PATHS = {"planner": "p", "searcher": "s", "coder": "c"}


def test_quick_demo_schedule_is_unchanged():
    cfg = run_config(DemoConfig(), PATHS)
    assert cfg["stages"] == [{"stage": 1, "rounds": 40}]
    assert cfg["eval_stage"] == 1 and cfg["eval_questions"] == 200 and cfg["eval_every"] == 10
    assert DemoConfig().threads == 1
    # demo.yaml carries the demo's CPU settings: `mgrpo eval` of the run takes them
    assert (cfg["cpu_kernels"], cfg["cpu_threads"]) == ("avx2", 1)
    native = run_config(DemoConfig(cpu_kernels="native", threads=2), PATHS)
    assert (native["cpu_kernels"], native["cpu_threads"]) == ("native", 2)
    assert run_config(DemoConfig(stage=2), PATHS)["eval_stage"] == 2  # follows stage


def test_demo_full_is_a_stage1_then_stage2_curriculum_evaluated_on_stage2():
    fields = yaml.safe_load((ROOT / "examples" / "demo_full.yaml").read_text())
    demo = DemoConfig.model_validate(fields)
    assert demo.stage is None  # demonstrations of both stages
    assert demo.sft_steps["coder"] >= 1000 and demo.coder_errors == {"code_slip": 0.2}
    cfg = RunConfig.model_validate(run_config(demo, PATHS))
    assert [(s.stage, s.rounds) for s in cfg.stages] == [(1, 10), (2, 40)]
    assert cfg.eval_stage == 2
    assert "demo-full:" in (ROOT / "Makefile").read_text()


def test_rounds_and_stages_together_are_refused():
    with pytest.raises(ValidationError, match="either rounds"):
        DemoConfig(rounds=5, stages=[{"stage": 1, "rounds": 5}])


def test_demo_set_reaches_the_run_config_async():
    """`mgrpo demo --set max_staleness=1 --set loss.rollout_is=token` (issue 15.2): the RL
    rounds run asynchronously; the demo's other settings and `make demo` stay as they were."""
    from mgrpo.cli.run import demo_config

    demo = demo_config(Path("runs/x"), 0, None, None,
                       ["max_staleness=1", "loss.rollout_is=token"])
    assert demo.run_set == {"max_staleness": 1, "loss.rollout_is": "token"}
    cfg = RunConfig.model_validate(run_config(demo, PATHS))
    assert cfg.max_staleness == 1 and cfg.loss.rollout_is == "token"
    assert [cfg.staleness(m) for m in ("planner", "searcher", "coder")] == [1, 1, 1]
    assert cfg.loss.eps_low == 0.2 and cfg.k == 8 and cfg.out_dir == "runs/x/run"
    assert demo.tools == {"search": {"k": 1}}  # the overrides did not write into the demo
    plain = RunConfig.model_validate(run_config(demo_config(Path("runs/x"), 0, None, None,
                                                            []), PATHS))
    assert plain.max_staleness == 0 and plain.loss.rollout_is == "none"
    assert "$(BIN)/mgrpo demo\n" in (ROOT / "Makefile").read_text()  # make demo: sync


def test_demo_run_set_from_a_yaml_file_and_the_command_line_merge(tmp_path):
    from mgrpo.cli.run import demo_config

    path = tmp_path / "demo.yaml"
    path.write_text("rounds: 5\nrun_set: {loss.rollout_is: token}\n")
    demo = demo_config(tmp_path / "out", 3, None, path, ["max_staleness=1"])
    cfg = RunConfig.model_validate(run_config(demo, PATHS))
    assert (cfg.max_staleness, cfg.loss.rollout_is, cfg.seed) == (1, "token", 3)
    assert [(s.stage, s.rounds) for s in cfg.stages] == [(1, 5)]


@pytest.mark.parametrize("run_set, match", [
    ({"max_staleness": 1, "loss.rollout_is": "none"},      # async without the correction
     "needs loss.rollout_is"),
    ({"max_stalenes": 1}, "max_staleness"),                # misspelt: names the nearest key
    ({"loss.rollout_is": "tokens"}, "rollout_is"),
])
def test_a_bad_demo_run_set_is_refused_before_the_warm_start(run_set, match):
    with pytest.raises(ValidationError, match=match):
        DemoConfig(run_set=run_set)


def test_held_out_entities_default_keeps_the_demo_benchmark_and_can_double_the_held_out_set():
    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.experiments.demo import demo_benchmark

    small = dict(n_train=300, n_test=600)  # fast; the test split is built last either way
    entities = BenchmarkConfig().entities
    entities["train"] = dict(DemoConfig().train_entities)
    reference = build_benchmark(BenchmarkConfig(seed=0, entities=entities, **small))
    default = demo_benchmark(DemoConfig(**small))
    assert [q.model_dump() for q in default.all_questions] == \
        [q.model_dump() for q in reference.all_questions]
    assert len(default.questions("test", stage=1)) == 210

    fields = yaml.safe_load((ROOT / "examples" / "ablate_stage1_462.yaml").read_text())
    demo = DemoConfig.model_validate({**fields, "n_train": 300})
    held_out = demo_benchmark(demo).questions("test", stage=1)
    assert len(held_out) == 462 == demo.eval_questions
    assert len({q.question for q in held_out}) == 462  # no look-up asked twice
    test_names = {e.name for e in demo_benchmark(demo).kg.entities if e.split == "test"}
    train_names = {e.name for e in demo_benchmark(demo).kg.entities if e.split == "train"}
    assert not test_names & train_names


def test_stage2_ablation_config_evaluates_400_distinct_stage2_questions():
    from mgrpo.experiments.demo import demo_benchmark

    fields = yaml.safe_load((ROOT / "examples" / "ablate_stage2.yaml").read_text())
    demo = DemoConfig.model_validate({**fields, "n_train": 300})
    assert demo.held_out_stage() == 2 and demo.eval_every == 0
    held_out = demo_benchmark(demo).questions("test", stage=2)
    assert len(held_out) == 400 == demo.eval_questions
    assert len({q.question for q in held_out}) == 400
    assert {q.kind for q in held_out} == {"chain", "compare", "arith"}


def test_held_out_entities_refuses_train():
    from mgrpo.experiments.demo import demo_benchmark

    with pytest.raises(ValueError, match="train_entities"):
        demo_benchmark(DemoConfig(n_train=300, held_out_entities={"train": {"city": 5}}))


def test_single_agent_warm_start_gets_the_sft_steps_of_every_role_it_plays():
    """The single model plays every role the schedule reaches, so its SFT budget is the
    multi-agent models' total: planner + searcher on stage 1, + coder once stage 2 is in."""
    from mgrpo.experiments.ablate import single_agent_roles

    assert single_agent_roles(DemoConfig()) == ("planner", "searcher")
    stage2 = DemoConfig.model_validate(
        yaml.safe_load((ROOT / "examples" / "ablate_stage2.yaml").read_text()))
    assert single_agent_roles(stage2) == ("planner", "searcher", "coder")
    assert sum(stage2.sft_steps[r] for r in single_agent_roles(stage2)) == 4000
    assert single_agent_roles(DemoConfig(stage=None)) == ("planner", "searcher", "coder")


def test_the_demo_prints_the_measured_spread_of_its_own_recipe_only():
    """Issue 17.4: the demo prints the spread of earlier runs beside its own figures, for
    `make demo`'s recipe (any output folder, any thread count) and for nothing else."""
    from mgrpo.experiments.demo_spread import DEMO_RUNS, demo_spread

    line = demo_spread(DemoConfig(out_dir="/tmp/elsewhere", threads=2))
    lows = [r.greedy[0] for r in DEMO_RUNS]
    assert f"greedy {min(lows):.3f}-{max(lows):.3f} after the warm start" in line
    assert "greedy 0.225-0.310" in line and "gain +20.5 to +26.0 points" in line
    for other in (DemoConfig(seed=1), DemoConfig(rounds=10),
                  DemoConfig.model_validate(yaml.safe_load(
                      (ROOT / "examples" / "demo_full.yaml").read_text()))):
        assert demo_spread(other) is None
