"""Config ergonomics: ``--set`` values are YAML, indexed keys reach into lists, ``train
--rounds``, TRL's and verl's names answered with ours, ``mgrpo config check``, a YAML error
names the file, and a file given to the wrong command says which command it is for. Before,
``--set 'stages=[{stage: 1, rounds: 2}]'`` became a string (``Input should be a valid
list``) and examples/demo_full.yaml given to ``train`` gave three ``unknown key`` errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.cli.run import _parse_overrides, _with_rounds
from mgrpo.experiments.config_files import KINDS, check_file
from mgrpo.training import aliases
from mgrpo.training.config_files import (
    KIND_KEYS,
    ConfigFileError,
    load_run_config,
    rounds_for_steps,
    with_rounds,
)
from mgrpo.validation import one_line

ROOT = Path(__file__).resolve().parents[3]
MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _config(tmp_path, name="run.yaml", **extra):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"models": MODELS, "out_dir": str(tmp_path / "out"),
                                    **extra}))
    return path


def test_set_values_are_yaml(tmp_path):
    overrides = _parse_overrides(["stages=[{stage: 1, rounds: 2}, {stage: 2, rounds: 3}]",
                                  "k=4", "models.planner.lr=1e-3", "eval_stage=null",
                                  "name=run-7", "loss.dynamic_sampling=true"])
    assert overrides["models.planner.lr"] == 1e-3  # YAML 1.1 reads 1e-3 as text
    cfg = load_run_config(_config(tmp_path), overrides)
    assert [(s.stage, s.rounds) for s in cfg.stages] == [(1, 2), (2, 3)]
    assert (cfg.k, cfg.models["planner"].lr, cfg.eval_stage, cfg.name) == (4, 1e-3, None,
                                                                            "run-7")
    assert cfg.loss.dynamic_sampling is True


def test_indexed_keys(tmp_path):
    path = _config(tmp_path, stages=[{"stage": 1, "rounds": 5}, {"stage": 2, "rounds": 9}])
    cfg = load_run_config(path, _parse_overrides(["stages.1.rounds=2",
                                                  "stages.2={stage: 2, rounds: 1}"]))
    assert [(s.stage, s.rounds) for s in cfg.stages] == [(1, 5), (2, 2), (2, 1)]
    # no stages in the file: the default curriculum is the list indexed
    plain = _config(tmp_path, "plain.yaml")
    assert load_run_config(plain, {"stages.0.rounds": 2}).stages[0].rounds == 2
    with pytest.raises(ValueError, match=r"--set stages.5.rounds: index 5 is past the end"):
        load_run_config(path, {"stages.5.rounds": 2})
    with pytest.raises(ValueError, match=r"'first' is not an index of a list of 2"):
        load_run_config(path, {"stages.first.rounds": 2})


def test_rounds_cut_or_stretch_the_curriculum(tmp_path):
    stages = [{"stage": 1, "rounds": 10}, {"stage": 2, "rounds": 40}]
    assert with_rounds(stages, 2) == [{"stage": 1, "rounds": 2}]
    assert with_rounds(stages, 15) == [{"stage": 1, "rounds": 10}, {"stage": 2, "rounds": 5}]
    assert with_rounds(stages, 60) == [{"stage": 1, "rounds": 10}, {"stage": 2, "rounds": 50}]
    cfg = _with_rounds(load_run_config(_config(tmp_path, stages=stages)), 3)
    assert [(s.stage, s.rounds) for s in cfg.stages] == [(1, 3)]


def test_steps_give_the_rounds_that_make_them():
    assert rounds_for_steps({"planner": 1, "searcher": 1}, 5) == 5
    assert rounds_for_steps({"planner": 4, "searcher": 4}, 12) == 3  # mini_batches x epochs
    with pytest.raises(ValueError, match=r"^--steps 10 is not a multiple of the 4 optimizer "
                       r"steps .*; use --steps 8 or 12$"):
        rounds_for_steps({"planner": 4}, 10)
    with pytest.raises(ValueError, match=r"^--steps 3 .*; use --steps 4$"):
        rounds_for_steps({"planner": 4}, 3)
    with pytest.raises(ValueError, match=r"different numbers of optimizer steps per round "
                       r"\(planner 2, searcher 1: "):
        rounds_for_steps({"planner": 2, "searcher": 1}, 4)


def flat(result) -> str:
    """A CLI error as one line of words (typer draws it in a box, wrapped)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_train_steps_sets_the_rounds(tmp_path, monkeypatch):
    """``train --steps 6`` with every model at mini_batches 2: 3 rounds (the first stage cut
    to 3); refused when the planner alone makes 2 steps a round, or with --rounds too."""
    import mgrpo.training.loop as loop

    trained = []

    def run_training(cfg, **_):
        trained.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(loop, "run_training", run_training)
    path = _config(tmp_path, stages=[{"stage": 1, "rounds": 10}, {"stage": 2, "rounds": 40}])
    two = [f"--set=models.{m}.mini_batches=2" for m in ("planner", "searcher", "coder")]
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--steps", "6", *two,
                                      "--set", f"out_dir={tmp_path / 'out'}"])
    assert [(s.stage, s.rounds) for s in trained[0].stages] == [(1, 3)], result.output
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--steps", "6",
                                      "--set", "models.planner.mini_batches=2"])
    assert result.exit_code != 0 and "different numbers of optimizer steps" in flat(result)
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--steps", "6",
                                      "--rounds", "2"])
    assert result.exit_code != 0 and "--rounds or --steps" in flat(result)


@pytest.mark.parametrize(("extra", "where", "key", "ours", "origin"), [
    ({"models": {**MODELS, "planner": {"path": "/x", "learning_rate": 1e-5}}},
     "models.planner: ", "learning_rate", "lr", "TRL"),
    ({"num_generations": 4}, "", "num_generations", "k", "TRL"),
    ({"rollout": {"n": 4}}, "", "rollout", aliases.RUN["rollout"][0], "verl"),
    ({"beta": 0.04}, "", "beta", "loss.kl_coef", "TRL"),
    ({"loss": {"clip_ratio_low": 0.2}}, "loss: ", "clip_ratio_low", "eps_low", "verl"),
    ({"epsilon": 0.2}, "", "epsilon", "loss.eps_low", "TRL"),
    ({"max_completion_length": 64}, "", "max_completion_length", "sampling.max_new_tokens",
     "TRL"),
    ({"sampling": {"max_response_length": 64}}, "sampling: ", "max_response_length",
     "max_new_tokens", "verl"),
    ({"output_dir": "x"}, "", "output_dir", "out_dir", "TRL"),
])
def test_trl_and_verl_names_are_answered_with_ours(tmp_path, extra, where, key, ours, origin):
    data = {"models": MODELS, **extra}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValidationError) as caught:
        load_run_config(path)
    assert one_line(caught.value) == (f"invalid RunConfig: {where}unknown key '{key}' "
                                      f"({origin}'s {key} is '{ours}' here)")


def test_the_rosetta_table_lists_every_alias():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    table = doc[doc.index("## Coming from TRL or verl"):]
    for section in (aliases.RUN, aliases.MODEL, aliases.LOSS, aliases.SAMPLING):
        for key in section:
            assert f"`{key}`" in table, key


def test_yaml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("models:\n  planner: {path: x\nk: 4\n")
    with pytest.raises(ConfigFileError, match=re.escape(f"{path}, line ")) as caught:
        load_run_config(path)
    assert "YAML syntax error" in str(caught.value) and "unicode string" not in str(caught.value)
    result = CliRunner().invoke(app, ["train", "--config", str(path)])
    assert result.exit_code == 1 and f"error: {path}, line" in result.output


def test_a_demo_config_given_to_train_says_so():
    demo = ROOT / "examples" / "demo_full.yaml"
    with pytest.raises(ConfigFileError, match="is a demo config, not a run config") as caught:
        load_run_config(demo)
    assert f"mgrpo demo --config {demo}" in caught.value.hint
    result = CliRunner().invoke(app, ["train", "--config", str(demo)])
    assert result.exit_code == 1 and "is a demo config" in result.output
    assert "unknown key" not in result.output


def test_the_run_side_knows_each_kind_by_its_models_keys():
    """The run config's reader tells kinds apart by their top-level keys, without importing
    the experiments' models; they are those models' fields."""
    assert {kind: (model.__name__, frozenset(model.model_fields))
            for kind, model in KINDS.items()} == KIND_KEYS


def test_a_run_config_given_to_demo_says_so(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--config", str(_config(tmp_path)),
                                      "--out", str(tmp_path / "demo")])
    assert result.exit_code == 1 and "is a run config, not a demo config" in result.output
    assert "mgrpo train --config" in result.output
    assert not (tmp_path / "demo").exists()


def test_config_check(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    good = _config(tmp_path, models={m: {"path": str(model)} for m in MODELS},
                   bench_dir=str(bench))
    result = CliRunner().invoke(app, ["config", "check", str(good)])
    assert result.exit_code == 0, result.output
    assert f"{good}: ok, a run config for `mgrpo train --config {good}`" in result.output
    kind, problems = check_file(ROOT / "examples" / "bring_your_own_model.yaml")
    qwen = ROOT / "runs" / "models" / "qwen"
    assert kind == "run" and f"models.qwen.path: {qwen} does not exist" in problems
    missing = _config(tmp_path, "missing.yaml", bench_dir=str(tmp_path / "nobench"))
    result = CliRunner().invoke(app, ["config", "check", str(missing)])
    assert result.exit_code == 1
    assert "models.planner.path: /nowhere does not exist" in result.output
    assert f"bench_dir: {tmp_path / 'nobench'} does not exist" in result.output
    kind, problems = check_file(ROOT / "examples" / "demo_full.yaml")
    assert (kind, problems) == ("demo", [])
    typo = _config(tmp_path, "typo.yaml", kk=4)
    assert check_file(typo) == ("run", ["invalid RunConfig: unknown key 'kk' "
                                        "(did you mean 'k'?)"])


def test_relative_paths_start_at_the_config_files_folder(tmp_path, monkeypatch):
    import os

    from mgrpo.training.config_files import map_paths

    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "run.yaml"
    path.write_text(yaml.safe_dump({
        "models": {"planner": {"path": "../models/p"}, "searcher": {"path": "/abs/s"},
                   "coder": {"path": "models/c", "ref_path": "ref"}},
        "bench_dir": "../bench", "out_dir": "out",
        "judges": {"searcher": {"kind": "llm", "model": "planner", "prompt": "judge.txt"}}}))
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config(Path("configs/run.yaml"), {"init_from.run_id": "a",
                                                     "init_from.out_dir": "here"})
    assert cfg.models["planner"].path == "models/p"
    assert cfg.models["searcher"].path == "/abs/s"
    assert (cfg.models["coder"].path, cfg.models["coder"].ref_path) == ("configs/models/c",
                                                                        "configs/ref")
    assert (cfg.bench_dir, cfg.out_dir) == ("bench", "configs/out")
    assert cfg.judges["searcher"].prompt == "configs/judge.txt"
    assert cfg.init_from.out_dir == "here"  # --set: from the current folder
    assert load_run_config(path).bench_dir == str(tmp_path / "bench")  # an absolute file path
    # what the demo writes into its folder reads back as the same paths
    written = map_paths(cfg.model_dump(mode="json"), lambda p: os.path.relpath(p, "configs"))
    (tmp_path / "configs" / "again.yaml").write_text(yaml.safe_dump(written))
    again = load_run_config(Path("configs/again.yaml"))
    assert (again.bench_dir, again.models["planner"].path) == ("bench", "models/p")
