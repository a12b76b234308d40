"""The bench smoke tests' kit: which file of ``bench/`` is a script, which a helper, and how to
run a script as its own process at a tiny size (``tests/unit/bench/test_bench_smoke.py``,
``tests/integration/bench/test_bench_smoke_services.py``).

A script is run the way a person runs it (``python bench/NAME.py ...``, a fresh process with
the repository on the path), so a broken import, a renamed helper or a changed signature fails
the suite instead of the next benchmark run. Sizes are the smallest that still take every
step of the script; the figures are not checked, only that the result is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# Imported or started by the scripts (not run on their own): covered through them.
HELPERS = {"fault_probe_report.py": "fault_probe.py", "rank_timing.py": "trainer_ranks.py",
           "report.py": "team_round.py, round_scaling.py, fault_probe.py",
           "round_harness.py": "round.py", "round_repeats.py": "round.py",
           "round_services.py": "round.py, async_round.py --distributed",
           "trl_step.py": "grpo_step.py (with .venv-trl)"}
# Scripts with a smoke test of their own.
TESTED_ELSEWHERE = {"gpu.py": "tests/unit/bench/test_bench_gpu.py (--tiny)"}
# The scripts each tier runs (the tests assert that every script of bench/ is in one).
UNIT_SCRIPTS = ("api_load.py", "async_round.py", "cpu_kernels.py", "demo_async.py",
                "engine.py", "grpo_step.py", "kl_cost.py", "sandbox.py",
                "scaling.py", "shared_base_memory.py", "team_round.py", "trainer_ranks.py",
                "update_mfu.py", "weight_sync.py")
SERVICE_SCRIPTS = ("async_round.py", "fault_probe.py", "ingest.py", "publish.py", "round.py",
                   "round_scaling.py")


def bench_files() -> set[str]:
    return {path.name for path in BENCH.glob("*.py")}


def run_bench(script: str, *argv: str, env: dict[str, str] | None = None,
              timeout_s: float = 580.0) -> subprocess.CompletedProcess:
    """``python bench/SCRIPT ARGV...`` from the repository root, one torch thread; fails the
    test with the script's output when it exits non-zero. Prints the CPU seconds it and its
    children used (``pytest -s``): on a shared machine a closer guide to a quiet machine's
    wall time than the wall time itself."""
    import resource
    import time

    import pytest

    path = os.pathsep.join([str(ROOT / "shared"), str(ROOT),
                            os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    cpu_before, started = _children_cpu_s(resource), time.perf_counter()
    proc = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout_s)
    print(f"bench/{script}: {_children_cpu_s(resource) - cpu_before:.1f} CPU s, "
          f"{time.perf_counter() - started:.1f} s wall")
    if proc.returncode != 0:
        pytest.fail(f"bench/{script} {' '.join(argv)} exited {proc.returncode}:\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}", pytrace=False)
    return proc


def _children_cpu_s(resource) -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_json(path: Path) -> dict:
    assert path.exists(), f"{path} was not written"
    return json.loads(path.read_text())
