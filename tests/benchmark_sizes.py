"""The small benchmark the tests build (a second or so): ``SMALL``, entities per split, and
``small_bench_config`` (importable from every test: ``tests/`` is on sys.path through the root
conftest)."""

from __future__ import annotations

from mgrpo.envs import BenchmarkConfig

SMALL = {"train": {"city": 12, "person": 16, "company": 8},
         "dev": {"city": 6, "person": 8, "company": 4},
         "test": {"city": 6, "person": 8, "company": 4}}


def small_bench_config(seed: int = 0) -> BenchmarkConfig:
    return BenchmarkConfig(seed=seed, n_train=120, n_dev=40, n_test=40, entities=SMALL)
