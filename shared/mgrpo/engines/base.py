"""The engine interface every back-end implements.

Requests carry token ids, not text: multi-turn episodes grow a context by appending the ids of
each generated segment and each observation, so what the trainer scores is exactly what the
sampler saw (no re-tokenisation drift). ``text`` on a completion is for parsing only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)  # stop strings (kept in the output)
    stop_token_ids: list[int] = field(default_factory=list)  # kept in the output
    seed: int | None = None


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]
    # one per completion id: log p(token | prefix) at the sampling temperature, the
    # distribution sampled (every engine; greedy rows: T = 1). docs/algorithm.md "rollout
    # logprobs"
    logprobs: list[float]
    text: str  # decoded completion_ids
    finish_reason: Literal["stop", "length"]


@runtime_checkable
class Engine(Protocol):
    """What agents sample from. ``version`` is the weights version now loaded."""

    version: int

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]: ...

    def load_weights(self, source: object, version: int) -> None:
        """Load new weights (a state dict or a checkpoint path/URI) between rounds."""
        ...
