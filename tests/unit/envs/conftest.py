"""Fixtures: a small seeded benchmark (fast) and the real tools over it."""

from __future__ import annotations

import pytest
from mgrpo.envs import BenchmarkConfig, build_benchmark

SMALL = {"train": {"city": 12, "person": 16, "company": 8},
         "dev": {"city": 6, "person": 8, "company": 4},
         "test": {"city": 6, "person": 8, "company": 4}}


def small_config(seed: int = 0) -> BenchmarkConfig:
    return BenchmarkConfig(seed=seed, n_train=120, n_dev=40, n_test=40, entities=SMALL)


@pytest.fixture(scope="session")
def small_bench():
    return build_benchmark(small_config())


@pytest.fixture(scope="session")
def local_tools(small_bench):
    from mgrpo.sandbox.local import LocalSandbox
    from mgrpo.tools import build_tool

    return {"searcher": build_tool("search", corpus=small_bench.corpus),
            "coder": build_tool("python", executor=LocalSandbox())}
