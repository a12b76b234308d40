"""CLI errors are one line and a hint; ``--debug`` / ``MGRPO_DEBUG=1`` show the traceback.
Before, a missing config key or model folder printed a ~40-line traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _mgrpo(*argv: str, debug_env: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MGRPO_DEBUG"}
    if debug_env:
        env["MGRPO_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", *argv], env=env,
                          capture_output=True, text=True, timeout=120)


def _bad_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"models": MODELS, "kk": 4}))
    return str(path)


def test_a_config_error_is_one_line_and_a_hint(tmp_path):
    done = _mgrpo("train", "--config", _bad_config(tmp_path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "error: invalid RunConfig: unknown key 'kk' (did you mean 'k'?)"
    assert lines[1].startswith("hint: ")
    assert len(lines) == 3 and "--debug" in lines[2]
    assert "Traceback" not in done.stderr


def test_a_missing_model_folder_is_one_line(tmp_path):
    done = _mgrpo("models", "info", str(tmp_path / "no-such-model"))
    assert done.returncode == 1
    assert done.stderr.startswith("error: ")
    assert "no-such-model" in done.stderr.splitlines()[0]
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3


def test_debug_flag_and_env_show_the_traceback(tmp_path):
    for done in (_mgrpo("--debug", "train", "--config", _bad_config(tmp_path)),
                 _mgrpo("train", "--config", _bad_config(tmp_path), debug_env=True)):
        assert done.returncode == 1
        assert "Traceback (most recent call last)" in done.stderr
        assert "unknown key 'kk'" in done.stderr
