"""Helpers for the envs tests (a plain module: conftest files are not importable)."""

from __future__ import annotations

from mgrpo.envs import BenchmarkConfig

SMALL = {"train": {"city": 12, "person": 16, "company": 8},
         "dev": {"city": 6, "person": 8, "company": 4},
         "test": {"city": 6, "person": 8, "company": 4}}


def small_config(seed: int = 0) -> BenchmarkConfig:
    return BenchmarkConfig(seed=seed, n_train=120, n_dev=40, n_test=40, entities=SMALL)
