"""``mgrpo config check`` passes every file under ``examples/`` (run, demo and team ablation
configs) once the folders README "Beyond the demo" builds exist, and refuses a mistyped key
of a team ablation config in one line. Before, each ``ablate_team_*.yaml`` was read as a run
config and answered with one ``unknown key`` per ablation option."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.experiments.config_files import check_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# What README "Beyond the demo" and the examples' first lines build under runs/.
BUILT = ("bench", "tiny", "tiny_worlds", "models/qwen", "ckpt/planner/v000000",
         "ckpt/searcher/v000000", "ckpt/coder/v000000", "real/ckpt/planner/v000000",
         "real/ckpt/searcher/v000000")


def _examples_beside_runs(tmp_path: Path) -> list[Path]:
    """Copies of examples/*.yaml in tmp/examples, with tmp/runs/ holding what they name."""
    (tmp_path / "examples").mkdir()
    for folder in BUILT:
        (tmp_path / "runs" / folder).mkdir(parents=True)
    return [Path(shutil.copy(p, tmp_path / "examples")) for p in sorted(EXAMPLES.glob("*.yaml"))]


def test_config_check_passes_every_example(tmp_path):
    files = _examples_beside_runs(tmp_path)
    assert len(files) >= 15
    result = CliRunner().invoke(app, ["config", "check", *map(str, files)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == len(files) and all(": ok, a " in line for line in lines)
    kinds = {p.name: check_file(p)[0] for p in files}
    assert {n for n, k in kinds.items() if k == "team ablation"} == \
        {p.name for p in EXAMPLES.glob("ablate_team_*.yaml")}
    assert kinds["demo_full.yaml"] == "demo" and kinds["embedded.yaml"] == "run"
    team = next(line for line in lines if "ablate_team_swap.yaml" in line)
    assert team.endswith("ok, a team ablation config for `mgrpo ablate --config "
                         f"{tmp_path / 'examples' / 'ablate_team_swap.yaml'}`")


def test_a_team_ablation_without_its_models_names_each_path(tmp_path):
    path = tmp_path / "examples" / "swap.yaml"
    path.parent.mkdir()
    shutil.copy(EXAMPLES / "ablate_team_swap.yaml", path)
    kind, problems = check_file(path)
    tiny = tmp_path / "runs" / "tiny"
    assert (kind, problems) == ("team ablation",
                                [f"base.models.tool_user.path: {tiny} does not exist",
                                 f"base.models.reasoner.path: {tiny} does not exist"])


def test_a_mistyped_team_ablation_key_is_refused_in_one_line(tmp_path):
    files = {p.name: p for p in _examples_beside_runs(tmp_path)}
    typo = files["ablate_team_alpha.yaml"]
    data = yaml.safe_load(typo.read_text())
    data["seedz"] = data.pop("seeds")
    typo.write_text(yaml.safe_dump(data))
    assert check_file(typo) == ("team ablation", [
        "invalid TeamAblateConfig: unknown key 'seedz' (did you mean 'seeds'?)"])
    result = CliRunner().invoke(app, ["config", "check", str(typo)])
    assert result.exit_code == 1
    assert result.output.splitlines()[1:] == [
        "  invalid TeamAblateConfig: unknown key 'seedz' (did you mean 'seeds'?)"]
    # a typo inside an arm's run config names the arm and the key
    data["seeds"] = data.pop("seedz")
    data["arms"]["specialised"] = {"kk": 4}
    typo.write_text(yaml.safe_dump(data))
    kind, problems = check_file(typo)
    assert len(problems) == 1 and "arm specialised" in problems[0]
    assert "unknown key 'kk' (did you mean 'k'?)" in problems[0]


def test_a_team_ablation_given_to_train_says_which_command_it_is_for():
    path = EXAMPLES / "ablate_team_alpha.yaml"
    result = CliRunner().invoke(app, ["train", "--config", str(path)])
    assert result.exit_code == 1 and "is a team ablation config, not a run config" \
        in result.output
    assert f"mgrpo ablate --config {path}" in result.output and "unknown key" not in \
        result.output
