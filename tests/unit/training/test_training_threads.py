"""Issue 17.4: the same seed gives the same warm start whatever thread count the shell has
and whatever vector unit the CPU offers.

CPU kernels split reductions by thread, and torch and MKL pick their kernels by the CPU's
instruction set, so torch at 1 and at 2 intra-op threads, or on AVX2 and AVX-512 kernels,
gives different weights after a few SFT steps (measured: docs/results.md). The demo
therefore fixes its own thread count (``DemoConfig.threads``, default 1) and kernels
(``DemoConfig.cpu_kernels``, default avx2; :mod:`mgrpo.training.numerics`); these tests run
the demo's warm start in fresh processes under other shell settings and compare the weights
bit for bit, and check that `mgrpo eval` takes a run config's settings (``cpu_kernels``,
``cpu_threads``). About 45 s on an idle 2-core machine (seven processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from mgrpo.experiments.demo import DemoConfig
from mgrpo.training.numerics import KERNEL_ENV, fix_numerics, is_x86

REPO = Path(__file__).resolve().parents[3]

SCRIPT = r'''
import hashlib, json, sys
from pathlib import Path
import torch
from mgrpo.envs import BenchmarkConfig, build_benchmark
from mgrpo.envs.demos import write_demos
from mgrpo.envs.experts import ExpertErrors
from mgrpo.models import load_model
from mgrpo.experiments.demo import DemoConfig, pin_cpu, warm_start
from mgrpo.training.system import build_tools

out = Path(sys.argv[1])
cfg = DemoConfig(out_dir=str(out), sft_batch=4, vocab_size=300, cpu_kernels=sys.argv[2])
pin_cpu(cfg)
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
print(json.dumps({"threads": torch.get_num_threads(), "sha256": digest.hexdigest(),
                  "kernels": torch.backends.cpu.get_cpu_capability()}))
'''


def _fresh_process(args: list[str], omp_threads: int, **shell: str) -> str:
    """stdout of ``python ARGS`` in a fresh process (kernels are chosen once per process):
    this checkout's library, OMP_NUM_THREADS set, no kernel pin from this shell, then
    ``shell``'s variables."""
    env = {**os.environ, "OMP_NUM_THREADS": str(omp_threads), "MKL_NUM_THREADS":
           str(omp_threads), "PYTHONPATH": f"{REPO / 'shared'}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}", "TOKENIZERS_PARALLELISM": "false",
           "MGRPO_PROGRESS": "0"}
    for name in KERNEL_ENV["avx2"]:
        env.pop(name, None)
    env.update(shell)
    proc = subprocess.run([sys.executable, *args], env=env, text=True, capture_output=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _warm_start(tmp_path: Path, omp_threads: int, kernels: str = "avx2",
                **shell: str) -> dict:
    out = tmp_path / f"omp{omp_threads}-{kernels}-{len(shell)}"
    stdout = _fresh_process(["-c", SCRIPT, str(out), kernels], omp_threads, **shell)
    return json.loads(stdout.strip().splitlines()[-1])


def test_demo_warm_start_is_identical_under_one_and_two_shell_threads(tmp_path):
    one, two = _warm_start(tmp_path, 1), _warm_start(tmp_path, 2)
    assert one["threads"] == two["threads"] == 1  # the demo's own setting wins
    assert one["sha256"] == two["sha256"]


def _has_avx2() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return is_x86() and cpuinfo.exists() and " avx2" in cpuinfo.read_text()


@pytest.mark.skipif(not _has_avx2(), reason="the AVX2 pin needs an x86 CPU with AVX2")
def test_demo_warm_start_takes_the_same_kernels_whatever_the_cpu_offers(tmp_path):
    """Another CPU is emulated by the shell asking torch and MKL for other kernels (what a
    machine without AVX-512, or without any vector unit, would pick by itself): the demo's
    pin wins and the weights are bit-identical. Measured before the pin: the shell's
    ATEN_CPU_CAPABILITY decided, and avx2, AVX-512 and default kernels gave three different
    weight hashes."""
    here = _warm_start(tmp_path, 1)
    other = _warm_start(tmp_path, 1, ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE")
    assert here["kernels"] == other["kernels"] == "AVX2"
    assert here["sha256"] == other["sha256"]
    # native leaves the choice to the machine (here: the shell's), and it shows.
    native = _warm_start(tmp_path, 1, "native", ATEN_CPU_CAPABILITY="default")
    assert native["kernels"] == "DEFAULT" and native["sha256"] != here["sha256"]


def test_unknown_cpu_kernels_are_refused():
    with pytest.raises(ValueError, match="cpu kernels 'avx3'"):
        fix_numerics(1, "avx3")
    with pytest.raises(ValidationError, match="cpu_kernels"):
        DemoConfig(cpu_kernels="avx512")


def _mgrpo_eval(tmp_path: Path, config: dict, **shell: str) -> dict:
    """`mgrpo eval` in a fresh process, the shell at 2 threads."""
    import yaml

    path = tmp_path / f"run-{config['cpu_kernels']}-{len(shell)}.yaml"
    path.write_text(yaml.safe_dump(config))
    stdout = _fresh_process(["-m", "mgrpo.cli.main", "eval", "--config", str(path), "--n",
                             "2", "--stage", "1"], 2, **shell)
    return json.loads(stdout[stdout.index("{"):])


@pytest.mark.skipif(not _has_avx2(), reason="the AVX2 pin needs an x86 CPU with AVX2")
def test_mgrpo_eval_takes_the_run_configs_kernels_and_threads(tmp_path, tiny_dir, bench_dir):
    """A pinned run (the demo writes cpu_kernels: avx2 and cpu_threads into demo.yaml) is
    evaluated with the kernels and thread count it was trained with, whatever the shell
    asks for. Before: `mgrpo eval` ran on the machine's own kernels, and docs/results.md had
    to tell users to export ATEN_CPU_CAPABILITY and MKL_CBWR by hand."""
    from training_testkit import run_config_dict

    config = run_config_dict(tmp_path, tiny_dir, bench_dir, cpu_kernels="avx2", cpu_threads=1)
    pinned = _mgrpo_eval(tmp_path, config, ATEN_CPU_CAPABILITY="default")
    assert pinned["cpu"]["kernels"] == "AVX2" and pinned["cpu"]["threads"] == 1
    # native: the shell (here standing in for another CPU) decides, and torch's threads too
    native = _mgrpo_eval(tmp_path, {**config, "cpu_kernels": "native", "cpu_threads": None},
                         ATEN_CPU_CAPABILITY="default")
    assert native["cpu"]["kernels"] == "DEFAULT" and native["cpu"]["threads"] == 2
