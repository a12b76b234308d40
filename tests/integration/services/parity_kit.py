"""The parity tests' harness: ``bench/round.py`` loaded as a module, and how long the shared
warm-start is trained."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH_ROUND = Path(__file__).resolve().parents[3] / "bench" / "round.py"
# Warm-start SFT steps of the parity tests' planner, searcher and single-agent models: enough
# for varied rewards and searcher calls in a B=6 x K=4 round (each parity test asserts that
# its round is not trivial); 400 steps took 7 minutes on a loaded machine, 150 about one.
PARITY_SFT_STEPS = 150


def load_bench_round():
    """``bench/round.py`` as the module ``bench_round`` (bench/ is not a package)."""
    if "bench_round" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_round", BENCH_ROUND)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_round"] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules["bench_round"]
