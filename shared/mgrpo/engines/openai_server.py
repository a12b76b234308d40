"""A minimal OpenAI-compatible completions server over any local :class:`Engine`.

Speaks the subset of ``POST /v1/completions`` that ``vllm serve`` speaks and that
:class:`mgrpo.engines.remote.RemoteEngine` uses: token-id prompts (``prompt: [[ids...]]``),
``max_tokens``, ``temperature``, ``top_p``, ``top_k`` (-1 or 0 = off), ``stop``,
``stop_token_ids``, ``seed``, ``n``, ``logprobs`` (the sampled token's logprob is always
returned; top alternatives are not) and ``return_tokens_as_token_ids`` (tokens come back as
``"token_id:123"``, as in vLLM). Logprobs are those of the distribution sampled
(``log_softmax(logits / T)``, vLLM's ``--logprobs-mode processed_logprobs``), or with
``logprobs_mode="raw_logprobs"`` the T = 1 ones (vLLM's default; re-scored teacher-forced
by the engine's ``model``: for tests of clients against such a server). Plus two mgrpo
endpoints: ``GET /mgrpo/version`` and ``POST /mgrpo/load_weights`` (load a checkpoint URI
between rounds).

What it does NOT do: chat completions, streaming, authentication, top-k alternative
logprobs, or concurrency (requests are served one at a time under a lock).
"""

from __future__ import annotations

import threading
import time
import uuid

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from mgrpo.engines.base import Engine, GenerationRequest, SamplingParams


class CompletionBody(BaseModel):
    model: str | None = None
    prompt: list[list[int]] | list[int] | list[str] | str
    max_tokens: int = Field(16, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=64)
    logprobs: int | None = Field(None, ge=0)
    return_tokens_as_token_ids: bool = False


class LoadWeightsBody(BaseModel):
    source: str = Field(description="checkpoint version directory (path or fsspec URI)")
    version: int = Field(ge=0)


def _prompts_as_ids(body: CompletionBody, tokenizer) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    result = []
    for item in prompt:
        ids = tokenizer(item, add_special_tokens=False)["input_ids"] \
            if isinstance(item, str) else list(item)
        if not ids:
            raise HTTPException(400, "empty prompt: give at least one token id")
        result.append(ids)
    return result


def _choice(index: int, completion, tokenizer, as_ids: bool) -> dict:
    if as_ids:
        tokens = [f"token_id:{t}" for t in completion.completion_ids]
    else:
        tokens = [tokenizer.decode([t], skip_special_tokens=False)
                  for t in completion.completion_ids]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {"index": index, "text": completion.text, "finish_reason": completion.finish_reason,
            "logprobs": {"tokens": tokens, "token_logprobs": completion.logprobs,
                         "top_logprobs": None, "text_offset": offsets}}


LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


def _raw_logprobs(model, completion) -> list[float]:
    """T = 1 logprobs of a completion's tokens, teacher-forced (what vLLM's raw mode reports)."""
    import torch

    from mgrpo.models.logprobs import token_logprobs

    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():
        logp = token_logprobs(model, ids)[0]
    return logp[len(completion.prompt_ids):].tolist()


def create_app(engine: Engine, tokenizer, model_name: str = "mgrpo",
               logprobs_mode: str = "processed_logprobs") -> FastAPI:
    """The FastAPI app serving ``engine`` (its tokenizer decodes tokens and text prompts)."""
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode={logprobs_mode!r}: use one of {LOGPROBS_MODES}")
    app = FastAPI(title="mgrpo completions", version="1")
    lock = threading.Lock()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.get("/mgrpo/version")
    def version() -> dict:
        return {"version": engine.version}

    @app.post("/mgrpo/load_weights")
    def load_weights(body: LoadWeightsBody) -> dict:
        from mgrpo.models.loading import folder_weights  # a plain HF folder: its weights

        with lock:
            engine.load_weights(folder_weights(body.source), body.version)
        return {"version": engine.version}

    @app.post("/v1/completions")
    def completions(body: CompletionBody) -> dict:
        if body.model not in (None, model_name):
            raise HTTPException(404, f"model {body.model!r} is not served here; "
                                     f"this server serves {model_name!r}")
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        requests = []
        for ids in _prompts_as_ids(body, tokenizer):
            for j in range(body.n):
                params = SamplingParams(
                    temperature=body.temperature, top_p=body.top_p, top_k=max(body.top_k, 0),
                    max_new_tokens=body.max_tokens, stop=stops,
                    stop_token_ids=list(body.stop_token_ids or []),
                    seed=None if body.seed is None else body.seed + j)
                requests.append(GenerationRequest(prompt_ids=ids, params=params))
        with lock:
            outputs = engine.generate(requests)
            if logprobs_mode == "raw_logprobs":
                for c in outputs:
                    c.logprobs = _raw_logprobs(engine.model, c)
        choices = [_choice(i, c, tokenizer, body.return_tokens_as_token_ids)
                   for i, c in enumerate(outputs)]
        prompt_tokens = sum(len(r.prompt_ids) for r in requests)
        completion_tokens = sum(len(c.completion_ids) for c in outputs)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens,
                          "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    return app
