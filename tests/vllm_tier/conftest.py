"""The vLLM tier (``tests/vllm_tier``; not ``tests/vllm``, which would shadow the ``vllm``
package as a namespace package): see ``vllm_process``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """The tiny Qwen2 (float32) of `mgrpo models init-tiny`, shared by both sides."""
    from mgrpo.models import TinyModelConfig, init_tiny

    return Path(init_tiny(tmp_path_factory.mktemp("tiny"), TinyModelConfig(seed=0)))


