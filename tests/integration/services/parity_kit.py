"""The parity tests' harness: ``bench/round.py`` loaded as a module, how long the shared
warm-start is trained, and the comparison of two rounds that must agree."""

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


def assert_rounds_equal(emb, svc, what: str = "trajectories") -> set[str]:
    """Two rounds (``bench_round.RoundData``) agree: the same planner outcomes (rewards within
    1e-6), the same tokens of every one of their ``what``, the same group statistics (within
    1e-6), the metrics both record (timings aside) within 1e-5 and the same updated weights
    (within 1e-5). Returns the names of the metrics compared."""
    import pytest
    import torch

    assert emb.outcomes.keys() == svc.outcomes.keys()
    for key, (fmt, correct, reward) in emb.outcomes.items():
        assert (fmt, correct) == svc.outcomes[key][:2], key
        assert reward == pytest.approx(svc.outcomes[key][2], abs=1e-6), key
    assert emb.tokens.keys() == svc.tokens.keys()
    differing = sorted(k for k in emb.tokens if emb.tokens[k] != svc.tokens[k])
    assert differing == [], f"{len(differing)} {what} sampled differently"
    assert emb.stats.keys() == svc.stats.keys()
    for key, (n, mean, std) in emb.stats.items():
        assert n == svc.stats[key][0], key
        assert (mean, std) == pytest.approx(svc.stats[key][1:], abs=1e-6), key
    common = {k for k in emb.metrics.keys() & svc.metrics.keys()
              if not k.startswith(("time/", "throughput/"))}
    for key in sorted(common):
        assert emb.metrics[key] == pytest.approx(svc.metrics[key], abs=1e-5), key
    assert emb.weights.keys() == svc.weights.keys()
    for model, state in emb.weights.items():
        for name, tensor in state.items():
            torch.testing.assert_close(tensor, svc.weights[model][name], atol=1e-5, rtol=0,
                                       msg=f"{model}.{name}")
    return common
