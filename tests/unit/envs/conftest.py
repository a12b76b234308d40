"""Fixtures: a small seeded benchmark (fast) and the real tools over it."""

from __future__ import annotations

import pytest
from benchmark_sizes import small_bench_config

from mgrpo.envs import build_benchmark


@pytest.fixture(scope="session")
def small_bench():
    return build_benchmark(small_bench_config())


@pytest.fixture(scope="session")
def local_tools(small_bench):
    from mgrpo.sandbox.local import LocalSandbox
    from mgrpo.tools import build_tool

    return {"searcher": build_tool("search", corpus=small_bench.corpus),
            "coder": build_tool("python", executor=LocalSandbox())}
