"""Issue 17.4: the same seed gives the same warm start whatever thread count the shell has.

CPU kernels split reductions by thread, so torch at 1 and at 2 intra-op threads gives
different weights after a few SFT steps (measured: docs/results.md). The demo therefore
fixes its own thread count (``DemoConfig.threads``, default 1); these tests run the demo's
warm start in fresh processes under OMP_NUM_THREADS=1 and =2 and compare the weights bit for
bit. About 20 s on an idle 2-core machine (two processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import hashlib, json, sys
from pathlib import Path
import torch
from mgrpo.envs import BenchmarkConfig, build_benchmark
from mgrpo.envs.demos import write_demos
from mgrpo.envs.experts import ExpertErrors
from mgrpo.models import load_model
from mgrpo.training.demo import DemoConfig, fix_threads, warm_start
from mgrpo.training.system import build_tools

out = Path(sys.argv[1])
cfg = DemoConfig(out_dir=str(out), sft_batch=4, vocab_size=300)
fix_threads(cfg)
small = {"city": 6, "person": 8, "company": 4}
bench = build_benchmark(BenchmarkConfig(n_train=60, n_dev=5, n_test=5, entities={
    "train": small, "dev": small, "test": small}))
tools = build_tools(bench, ["searcher"], tool_cfg=cfg.tools)
write_demos(bench, out / "demos", tools, ExpertErrors(), n=20, stage=1, seed=0)
texts = [d.text for d in bench.corpus.docs]
path = warm_start(cfg, "planner", out / "demos" / "planner.jsonl", 6, texts, 0.0)
model, _ = load_model(path)
digest = hashlib.sha256()
for key, value in sorted(model.state_dict().items()):
    digest.update(key.encode())
    digest.update(value.detach().numpy().tobytes())
print(json.dumps({"threads": torch.get_num_threads(), "sha256": digest.hexdigest()}))
'''


def _warm_start(tmp_path: Path, omp_threads: int) -> dict:
    shared = Path(__file__).resolve().parents[3] / "shared"
    env = {**os.environ, "OMP_NUM_THREADS": str(omp_threads), "MKL_NUM_THREADS":
           str(omp_threads), "PYTHONPATH": f"{shared}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / f"omp{omp_threads}"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], env=env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_demo_warm_start_is_identical_under_one_and_two_shell_threads(tmp_path):
    one, two = _warm_start(tmp_path, 1), _warm_start(tmp_path, 2)
    assert one["threads"] == two["threads"] == 1  # the demo's own setting wins
    assert one["sha256"] == two["sha256"]
