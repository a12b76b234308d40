"""Fixtures: a small seeded benchmark (saved to disk), its real tools, and a tiny model."""

from __future__ import annotations

import pytest
from benchmark_sizes import small_bench_config


@pytest.fixture(scope="session")
def bench(tmp_path_factory):
    from mgrpo.envs import build_benchmark

    return build_benchmark(small_bench_config())


@pytest.fixture(scope="session")
def bench_dir(bench, tmp_path_factory):
    path = tmp_path_factory.mktemp("bench")
    bench.save(path)
    return path


@pytest.fixture(scope="session")
def tools(bench):
    from mgrpo.training.system import build_tools

    return build_tools(bench, ["searcher", "coder"])


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A very small Qwen2 (2 layers, hidden 32): every test model starts from it."""
    from mgrpo.models import TinyModelConfig, init_tiny

    config = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=64, vocab_size=400)
    return init_tiny(tmp_path_factory.mktemp("tiny"), config)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from mgrpo.models import load_model

    return load_model(tiny_dir)[1]
