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


def test_demos_refuse_a_benchmark_the_experts_cannot_solve(tmp_path, small_bench):
    """A user's questions over the built-in documents: the experts answer them wrongly, so
    `data demos` refuses, writes nothing, and points at the transcript format instead."""
    from mgrpo.envs.benchmark import Benchmark
    from mgrpo.envs.questions import Question

    questions = [Question(id=f"u{i}", question=f"Which poet wrote ode {i}?", answer=f"poet {i}")
                 for i in range(12)]
    Benchmark(questions, small_bench.corpus).save(tmp_path / "user")
    runner = CliRunner()
    refused = runner.invoke(app, ["data", "demos", "--bench", str(tmp_path / "user"), "--out",
                                  str(tmp_path / "demos")])
    assert refused.exit_code == 1
    assert "error: the scripted experts answer 0% of 12 train questions correctly (under " \
        "50%)" in refused.output
    assert "docs/protocol.md, 'SFT transcripts'" in refused.output
    assert not (tmp_path / "demos").exists()
    small_bench.save(tmp_path / "bench")  # the built-in benchmark: solved, written
    made = runner.invoke(app, ["data", "demos", "--bench", str(tmp_path / "bench"), "--out",
                               str(tmp_path / "ok"), "--n", "20"])
    assert made.exit_code == 0, made.output
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["expert_accuracy"] == 1.0
