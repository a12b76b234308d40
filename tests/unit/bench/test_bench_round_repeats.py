"""``bench/round_repeats.py``: the ABBA order of the round bench's repeats and its summary
(median per mode, ratio of the medians, per-pair ratios)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[3] / "bench" / "round_repeats.py"


def load():
    if "round_repeats" not in sys.modules:  # bench/ is not a package
        spec = importlib.util.spec_from_file_location("round_repeats", PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["round_repeats"] = module
        spec.loader.exec_module(module)
    return sys.modules["round_repeats"]


def test_order_alternates_in_abba_pairs():
    order = load().mode_order(3)
    assert order == [(0, "embedded"), (0, "distributed"), (1, "distributed"),
                     (1, "embedded"), (2, "embedded"), (2, "distributed")]


def test_summary_medians_and_ratios():
    out = load().summarize({"embedded": [1.0, 2.0, 4.0], "distributed": [1.5, 1.0, 4.4]})
    assert out["median_s"] == {"embedded": 2.0, "distributed": 1.5}
    assert out["ratio_of_medians"] == 0.75  # medians of different pairs: not a pair's ratio
    assert out["pair_ratios"] == [1.5, 0.5, 1.1]
    assert out["pair_ratio_range"] == [0.5, 1.5]


def test_summary_refuses_unpaired_rounds():
    with pytest.raises(ValueError):
        load().summarize({"embedded": [1.0], "distributed": [1.0, 2.0]})
