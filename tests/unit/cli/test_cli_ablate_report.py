"""``mgrpo ablate`` writes its report under its own out dir, never into docs/results.md by
default (before, a trial run overwrote the committed results)."""

from __future__ import annotations

import inspect
from pathlib import Path

from mgrpo.cli.run import ablate
from mgrpo.experiments.ablate import AblateConfig


def test_report_goes_under_the_out_dir_by_default(tmp_path):
    assert AblateConfig(out_dir=str(tmp_path)).results_path() == tmp_path / "results.md"
    assert AblateConfig().results_path() == Path("runs/ablate/results.md")
    chosen = AblateConfig(out_dir=str(tmp_path), results_md="docs/results.md")
    assert chosen.results_path() == Path("docs/results.md")  # only when asked


def test_cli_default_is_not_the_docs():
    default = inspect.signature(ablate).parameters["results"].default
    assert default.default is None


def _run(tmp_path, name: str, greedy: dict[str, float]) -> dict:
    import json

    out = tmp_path / name
    out.mkdir()
    (out / "eval_after_questions.json").write_text(json.dumps(
        {"greedy": greedy, "sampled": greedy}))
    return {"out_dir": str(out)}


def test_paired_table_from_the_runs_per_question_results(tmp_path):
    """Co-training beats main-only on one hard question in 20 in both seeds: +0.05 with the
    hand-computed interval of tests/unit/algo/test_algo_paired.py ([0, 0.15]); main-only
    against itself is not significant; a variant without per-question files says so."""
    from mgrpo.experiments.ablate import paired_markdown

    easy = {f"q{i}": 1.0 for i in range(10)}
    base = {**easy, **{f"q{i}": 0.0 for i in range(10, 20)}}
    better = {**base, "q19": 1.0}
    results = {"co-training": [_run(tmp_path, "c0", better), _run(tmp_path, "c1", better)],
               "main-only": [_run(tmp_path, "m0", base), _run(tmp_path, "m1", base)],
               "single-agent": [{"out_dir": str(tmp_path / "missing")}]}
    lines = paired_markdown(results)
    row = next(line for line in lines if line.startswith("| co-training - main-only | greedy"))
    assert row == "| co-training - main-only | greedy | +0.050 | [+0.000, +0.150] | no |"
    assert any("single-agent | greedy | n/a" in line for line in lines)


def test_ablation_follows_the_demo_schedule():
    """The quick demo: one stage-1 run of --rounds; demo-full: its stage-1 rounds, then
    --rounds of stage 2, evaluated on stage 2 (the stage-2 ablation of issue 17.3)."""
    import yaml

    from mgrpo.experiments.ablate import variant_config
    from mgrpo.experiments.demo import DemoConfig

    paths = {"planner": "p", "searcher": "s", "coder": "c", "single": "x"}
    quick = variant_config(AblateConfig(rounds=15), "main-only", 0, paths)
    assert quick["stages"] == [{"stage": 1, "rounds": 15}] and quick["eval_stage"] == 1
    root = Path(__file__).resolve().parents[3]
    full = DemoConfig.model_validate(yaml.safe_load((root / "examples/demo_full.yaml")
                                                    .read_text()))
    cfg = AblateConfig(rounds=30, demo=full)
    run = variant_config(cfg, "co-training", 1, paths)
    assert run["stages"] == [{"stage": 1, "rounds": 10}, {"stage": 2, "rounds": 30}]
    assert run["eval_stage"] == 2 and run["seed"] == 1
    assert full.schedule()[-1]["rounds"] == 40  # the demo's own config is not modified


def _finished(tmp_path, completed: int):
    import json

    out = tmp_path / f"run{completed}"
    out.mkdir()
    (out / "state.json").write_text(json.dumps({"completed_rounds": completed}))
    (out / "eval_after_questions.json").write_text(json.dumps({"greedy": {}, "sampled": {}}))
    (out / "metrics.csv").write_text(
        "round,key,value\n0,eval/greedy/accuracy,0.25\n0,eval/sampled/accuracy,0.125\n"
        "0,planner/accuracy,0.5\n1,planner/accuracy,0.75\n"
        "2,eval/greedy/accuracy,0.5\n2,eval/sampled/accuracy,0.375\n")
    return out


def test_a_finished_run_is_read_back_and_an_unfinished_one_is_not(tmp_path):
    """`mgrpo ablate` run again skips what it finished (a later call adds variants/seeds)."""
    from mgrpo.experiments.ablate import finished_run

    assert finished_run(_finished(tmp_path, 2), rounds=2) == {
        "before": {"eval/greedy/accuracy": 0.25, "eval/sampled/accuracy": 0.125},
        "after": {"eval/greedy/accuracy": 0.5, "eval/sampled/accuracy": 0.375}}
    assert finished_run(_finished(tmp_path, 1), rounds=2) is None  # cut short
    assert finished_run(tmp_path / "absent", rounds=2) is None


def test_variants_subset_in_table_order_and_report(tmp_path):
    import pytest
    from pydantic import ValidationError

    from mgrpo.experiments.ablate import results_markdown

    cfg = AblateConfig(out_dir=str(tmp_path), variants=["co-training", "main-only"])
    assert cfg.variants == ["main-only", "co-training"]
    with pytest.raises(ValidationError, match="choose among"):
        AblateConfig(variants=["planner-only"])
    easy = {f"q{i}": float(i % 2) for i in range(10)}
    run = {"before": {"eval/greedy/accuracy": 0.2, "eval/sampled/accuracy": 0.1},
           "after": {"eval/greedy/accuracy": 0.5, "eval/sampled/accuracy": 0.4},
           "reused": True, **_run(tmp_path, "m0", easy)}
    md = results_markdown(cfg, {"main-only": [run]}, tmp_path / "c.png", 60.0)
    assert "--variants main-only` (1.0 min on this machine; 1 finished runs reused" in md
    assert "| main-only | 0.200 ± nan | 0.500 ± nan |" in md


def test_curves_have_one_panel_per_agent_metric(tmp_path):
    from PIL import Image

    from mgrpo.experiments.ablate import CURVES, plot_curves

    run = _finished(tmp_path, 2)  # planner/accuracy only: the other panels stay empty
    (run / "metrics.csv").write_text((run / "metrics.csv").read_text()
                                     + "0,searcher/reward_mean,0.5\n1,searcher/reward_mean,0.7\n")
    path = plot_curves(AblateConfig(out_dir=str(tmp_path)),
                       {"co-training": [{"out_dir": str(run)}]})
    assert path == tmp_path / "ablation_curves.png"
    assert Image.open(path).size == (500 * len(CURVES), 400)
