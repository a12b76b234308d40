"""`mgrpo data build/show/demos`: byte-identical across processes and hash seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmark_sizes import SMALL
from typer.testing import CliRunner

from mgrpo.cli.main import app

MGRPO = str(Path(sys.executable).with_name("mgrpo"))


def test_build_is_byte_identical_across_processes(tmp_path):
    config = tmp_path / "bench.json"
    config.write_text(json.dumps({"n_train": 60, "n_dev": 20, "n_test": 20, "entities": SMALL}))
    for name, hash_seed in (("a", "1"), ("b", "2")):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OMP_NUM_THREADS": "1"}
        subprocess.run([MGRPO, "data", "build", "--seed", "4", "--out", str(tmp_path / name),
                        "--config", str(config)], check=True, env=env, capture_output=True)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.*"))
    assert len(files) == 6
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_show_and_demos(tmp_path, small_bench):
    small_bench.save(tmp_path / "bench")
    runner = CliRunner()
    shown = runner.invoke(app, ["data", "show", str(tmp_path / "bench")])
    assert shown.exit_code == 0, shown.output
    assert "test       1 lookup       14" in shown.output
    assert f"documents: {len(small_bench.corpus)}" in shown.output
    made = runner.invoke(app, ["data", "demos", "--bench", str(tmp_path / "bench"), "--out",
                               str(tmp_path / "demos"), "--n", "30", "--split", "dev",
                               "--error-rate", "planner.skip_delegation=1"])
    assert made.exit_code == 0, made.output
    assert "30 episodes, expert accuracy 0.000" in made.output
    assert sorted(p.name for p in (tmp_path / "demos").iterdir()) == \
        ["planner.jsonl", "summary.json"]  # nobody was delegated to
    bad = runner.invoke(app, ["data", "demos", "--bench", str(tmp_path / "bench"), "--out",
                              str(tmp_path / "x"), "--error-rate", "planner.typo=1"])
    assert bad.exit_code != 0 and "KEY one of" in bad.output
