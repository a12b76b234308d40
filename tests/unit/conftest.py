"""Fixtures of the unit tier: a tiny model built once per session (BPE training + init take
about a second; ``tests/unit/training`` builds a smaller one of its own, its conftest) and a
migrated SQLite store per test."""

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


@pytest.fixture
def store(tmp_path):
    """A migrated SQLite store in a fresh temp folder."""
    from mgrpo.store import Store

    store = Store(f"sqlite:///{tmp_path}/store.db")
    store.upgrade()
    yield store
    store.close()
