"""A tiny model built once per session (BPE training + init take about a second)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from mgrpo.models import TinyModelConfig, init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny"), TinyModelConfig(seed=0))


@pytest.fixture
def tiny(tiny_dir):
    """A fresh (model, tokenizer) per test: tests may train or overwrite the weights."""
    from mgrpo.models import load_model

    return load_model(tiny_dir)
