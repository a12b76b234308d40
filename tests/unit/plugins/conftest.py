"""Fixtures: a small seeded benchmark."""

from __future__ import annotations

import pytest
from benchmark_sizes import small_bench_config


@pytest.fixture(scope="session")
def bench():
    from mgrpo.envs import build_benchmark

    return build_benchmark(small_bench_config())
