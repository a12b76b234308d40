"""scripts/demo_real.py (`make demo-real`) at its smoke size on a tiny random chat model: every
step runs (benchmark, chat demonstrations, zero-shot, warm start, RL per seed, evaluations)
and the summary holds each stage and a seed-level interval. Nothing here is expected to learn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_tokenizer import save_chat_model

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(900)


def test_demo_real_smoke(tmp_path):
    model = save_chat_model(tmp_path / "model")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MGRPO_PROGRESS": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo_real.py"), "--smoke",
                           "--model", str(model), "--out", str(tmp_path / "real"),
                           "--seeds", "0,1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "real" / "summary.json").read_text())
    for stage in ("zero-shot", "warm start (SFT)", "after RL, seed 0", "after RL, seed 1"):
        assert set(summary[stage]) == {"greedy", "sampled"}
    gain = summary["rl_gain_greedy"]
    assert gain["seeds"] == 2 and gain["questions"] == 4 and gain["low"] <= gain["high"]
    assert (tmp_path / "real" / "ckpt" / "planner" / "v000000").is_dir()
    assert "| warm start (SFT) |" in (tmp_path / "real" / "summary.md").read_text()
