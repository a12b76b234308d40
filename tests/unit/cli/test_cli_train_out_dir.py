"""``mgrpo train`` into a non-empty out_dir is refused unless --resume or --overwrite. Before,
it appended silently: metrics.csv held round 0 twice, checkpoints were overwritten."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from mgrpo.cli.errors import UserError
from mgrpo.cli.main import app
from mgrpo.cli.run import prepare_out_dir

MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _previous_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.csv").write_text("step,planner/reward\n0,0.5\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"models": MODELS, "out_dir": str(out)}))
    return config, out


def test_train_refuses_a_non_empty_out_dir(tmp_path):
    config, out = _previous_run(tmp_path)
    result = CliRunner().invoke(app, ["train", "--config", str(config)])
    assert result.exit_code == 1
    assert f"error: out_dir {out} is not empty" in result.output
    assert "--resume" in result.output and "--overwrite" in result.output
    assert (out / "metrics.csv").read_text() == "step,planner/reward\n0,0.5\n"  # untouched


def test_resume_keeps_and_overwrite_deletes(tmp_path):
    _, out = _previous_run(tmp_path)
    prepare_out_dir(out, resume=True, overwrite=False)
    assert (out / "metrics.csv").exists()
    prepare_out_dir(out, resume=False, overwrite=True)
    assert not out.exists()
    prepare_out_dir(out, resume=False, overwrite=False)  # absent or empty: fine


def test_overwrite_never_deletes_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "keep.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="refuses to delete"):
        prepare_out_dir(tmp_path / ".", resume=False, overwrite=True)
    with pytest.raises(UserError, match="contradict"):
        prepare_out_dir(tmp_path, resume=True, overwrite=True)
    assert (tmp_path / "keep.txt").exists()
