"""A run says how it goes on stderr whatever stderr is: one line per round and per
evaluation (docs/metrics.md, "Log lines"). Before, `mgrpo train > log 2>&1` wrote the
before/after evaluations and nothing in between; round metrics were a tqdm postfix only on a
terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from training_testkit import run_config_dict

from mgrpo.progress import format_line
from mgrpo.training.metrics import round_line_values

ROUND_LINE = re.compile(r"^round (\d+)/(\d+) \| (.+) \| (\d+\.\d) s$")


def test_round_line_format():
    metrics = {"searcher/reward_mean": 0.25, "planner/reward_mean": 0.5,
               "planner/accuracy": 0.4375, "planner/frac_reward_zero_std": 0.75,
               "planner/grad_norm": 0.0123456, "time/rollout_s": 2.0, "planner/loss": 1.0}
    line = format_line("round 12/40", round_line_values(metrics), 3.14)
    assert line == ("round 12/40 | planner/accuracy=0.4375 | planner/reward_mean=0.5 | "
                    "searcher/reward_mean=0.25 | planner/frac_reward_zero_std=0.75 | "
                    "planner/grad_norm=0.01235 | 3.1 s")


def _train(tmp_path: Path, tiny_dir, bench_dir, *args: str) -> subprocess.CompletedProcess:
    config = tmp_path / "run.yaml"
    data = run_config_dict(tmp_path, tiny_dir, bench_dir, report_to=[])
    data["stages"] = [{"stage": 1, "rounds": 3}]
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    env.pop("MGRPO_QUIET", None)
    # pipes, not a terminal: what nohup, CI and a Kubernetes Job give a run
    return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", "train", "--config",
                           str(config), *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)


def test_a_piped_run_logs_one_line_per_round(tmp_path, tiny_dir, bench_dir):
    done = _train(tmp_path, tiny_dir, bench_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    rounds = [m for line in lines if (m := ROUND_LINE.match(line))]
    assert [(m[1], m[2]) for m in rounds] == [("1", "3"), ("2", "3"), ("3", "3")]
    for m in rounds:
        fields = dict(f.split("=") for f in m[3].split(" | "))
        assert {"planner/accuracy", "planner/reward_mean", "planner/frac_reward_zero_std",
                "planner/grad_norm"} <= set(fields)
        assert 0.0 <= float(fields["planner/frac_reward_zero_std"]) <= 1.0
    assert sum(line.startswith("eval before | eval/") for line in lines) == 1
    assert sum(line.startswith("eval after | eval/") for line in lines) == 1
    assert "\r" not in done.stderr  # no progress bar off a terminal
    # the tiny random model answers nothing right, ever: every group is constant
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert any(w.startswith("warning: planner: every group had the same reward for 3 rounds")
               for w in warnings), lines
    assert '"rounds": 3' in done.stdout  # the result stays on stdout


def test_log_every_and_quiet(tmp_path, capsys, monkeypatch):
    from mgrpo.training.metrics import MetricsLogger

    def rounds_logged() -> list[str]:
        logger = MetricsLogger(tmp_path, report_to=(), log_every=2, total_rounds=5)
        for r in range(5):
            logger.log_round(r, {"planner/reward_mean": 0.5})
        logger.log_eval(5, {"eval/greedy/accuracy": 0.5}, "after")
        logger.close()
        return capsys.readouterr().err.splitlines()

    lines = rounds_logged()
    assert [m[1] for line in lines if (m := ROUND_LINE.match(line))] == ["2", "4", "5"]
    assert lines[-1].startswith("eval after | eval/greedy/accuracy=0.5 | ")
    monkeypatch.setenv("MGRPO_QUIET", "1")
    assert rounds_logged() == []


def test_transformers_bars_are_off(tiny_dir, capfd):
    from mgrpo.models import load_model

    load_model(tiny_dir)
    assert "Loading weights" not in capfd.readouterr().err
