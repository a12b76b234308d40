"""Inference engines: one interface (:class:`Engine`), several back-ends.

``TorchEngine`` (transformers, CPU or CUDA, the default), ``VLLMEngine`` (GPU, optional extra),
``RemoteEngine`` (any OpenAI-compatible server that returns logprobs).
"""

from mgrpo.engines.base import Completion, Engine, GenerationRequest, SamplingParams

__all__ = ["Completion", "Engine", "GenerationRequest", "SamplingParams"]
