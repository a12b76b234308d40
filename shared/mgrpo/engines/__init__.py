"""Inference engines: one interface (:class:`Engine`), several back-ends.

``TorchEngine`` (transformers, CPU or CUDA, the default), ``VLLMEngine`` (GPU, optional extra),
``RemoteEngine`` (any OpenAI-compatible server that returns logprobs), or a user engine
(``package.module:factory``); :mod:`mgrpo.engines.registry` builds any of them from its spec
for both modes.
"""

from mgrpo.engines.base import Completion, Engine, GenerationRequest, SamplingParams
from mgrpo.engines.registry import (
    EngineUnavailable,
    build_engine,
    engine_kind,
    engine_names,
    get_engine,
    register_engine,
)

__all__ = ["Completion", "Engine", "EngineUnavailable", "GenerationRequest", "SamplingParams",
           "build_engine", "engine_kind", "engine_names", "get_engine", "register_engine"]
