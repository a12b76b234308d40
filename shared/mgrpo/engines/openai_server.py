"""A minimal OpenAI-compatible completions server over any local :class:`Engine`.

Speaks the subset of ``POST /v1/completions`` that ``vllm serve`` speaks and that
:class:`mgrpo.engines.remote.RemoteEngine` uses: token-id prompts (``prompt: [[ids...]]``)
or text, ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` (-1 or 0 = off), ``stop``,
``stop_token_ids``, ``include_stop_str_in_output`` (as vLLM: without it the stop string or
stop token that ended a completion is left out of its text), ``seed`` (completion j of a
prompt: ``seed + j``), ``n``, ``logprobs=0`` (the sampled token's logprob is always
returned), ``return_tokens_as_token_ids`` (tokens come back as ``"token_id:123"``, as in
vLLM) and ``stream`` (server-sent events: one chunk per completion, sent once the request's
generation is done, then ``[DONE]``). Logprobs are those of the distribution sampled
(``log_softmax(logits / T)``, vLLM's ``--logprobs-mode processed_logprobs``), or with
``logprobs_mode="raw_logprobs"`` the T = 1 ones (vLLM's default; re-scored teacher-forced by
the engine's ``model``: for tests of clients against such a server). Plus ``GET /v1/models``
(and ``/v1/models/{id}``) and two mgrpo endpoints: ``GET /mgrpo/version`` and ``POST
/mgrpo/load_weights`` (load a checkpoint URI between rounds).

Every field is bounded (:mod:`mgrpo.engines.openai_protocol`), prompt + ``max_tokens`` must
fit the context length (``max_model_len``, default the model's ``max_position_embeddings``),
token ids must be in the vocabulary and the request body is capped (``max_body_bytes``):
anything else is a 4xx with OpenAI's error body, never an allocation the machine cannot make.

What it does NOT do: chat completions, token-by-token streaming, authentication, top-k
alternative logprobs, penalties, echo, or concurrency (requests are served one at a time
under a lock). The text always keeps special tokens (vLLM's ``skip_special_tokens=false``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from mgrpo.engines.base import Completion, Engine, GenerationRequest, SamplingParams
from mgrpo.engines.openai_protocol import (
    MAX_BODY_BYTES,
    MAX_SEQUENCES,
    BodyLimit,
    CompletionBody,
    OpenAIError,
    install_error_handlers,
)
from mgrpo.models.loading import folder_weights
from mgrpo.models.logprobs import token_logprobs

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


class LoadWeightsBody(BaseModel):
    source: str = Field(max_length=4096,
                        description="checkpoint version directory (path or fsspec URI)")
    version: int = Field(ge=0, le=2**31 - 1)


def _model_limits(engine: Engine, tokenizer, max_model_len: int | None) -> tuple[int, int]:
    """(context length, vocabulary size): token ids must be below both the tokenizer's and the
    model's embedding size."""
    config = getattr(getattr(engine, "model", None), "config", None)
    context = max_model_len or getattr(config, "max_position_embeddings", None)
    if not context:
        raise ValueError("the engine's model does not say its context length "
                         "(config.max_position_embeddings): pass max_model_len")
    vocab = min(len(tokenizer), getattr(config, "vocab_size", None) or len(tokenizer))
    return int(context), vocab


def _prompts_as_ids(body: CompletionBody, tokenizer, vocab: int) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if not prompt:
        raise OpenAIError(400, "empty prompt: give at least one token id", param="prompt")
    result = []
    for item in prompt:
        ids = tokenizer(item, add_special_tokens=False)["input_ids"] \
            if isinstance(item, str) else list(item)
        if not ids:
            raise OpenAIError(400, "empty prompt: give at least one token id", param="prompt")
        _check_ids(ids, vocab, "prompt")
        result.append(ids)
    return result


def _check_ids(ids: list[int], vocab: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise OpenAIError(400, f"token id {bad} is out of the vocabulary [0, {vocab})",
                          param=param, code="invalid_token_id")


def _stops(body: CompletionBody) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


def _requests(body: CompletionBody, tokenizer, context: int, vocab: int
              ) -> list[GenerationRequest]:
    prompts = _prompts_as_ids(body, tokenizer, vocab)
    if len(prompts) * body.n > MAX_SEQUENCES:
        raise OpenAIError(400, f"{len(prompts)} prompts x n={body.n}: at most "
                               f"{MAX_SEQUENCES} completions a request", param="n")
    stop_token_ids = list(body.stop_token_ids or [])
    _check_ids(stop_token_ids, vocab, "stop_token_ids")
    requests = []
    for ids in prompts:
        max_tokens = context - len(ids) if body.max_tokens is None else body.max_tokens
        if len(ids) + max_tokens > context:
            raise OpenAIError(
                400, f"this model's maximum context length is {context} tokens; the request "
                f"asks for {len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} "
                "to generate): shorten the prompt or lower max_tokens",
                param="max_tokens" if len(ids) < context else "prompt",
                code="context_length_exceeded")
        for j in range(body.n):
            params = SamplingParams(
                temperature=body.temperature, top_p=body.top_p,
                top_k=body.top_k if 0 < body.top_k < vocab else 0,
                max_new_tokens=max_tokens, stop=_stops(body), stop_token_ids=stop_token_ids,
                seed=None if body.seed is None else body.seed + j)
            requests.append(GenerationRequest(prompt_ids=ids, params=params))
    return requests


def _stop_reason(completion: Completion, params: SamplingParams, eos: int | None):
    """vLLM's ``stop_reason``: the stop token id or stop string that ended the completion
    (None: eos, or the length limit), and where the text ends without it."""
    if completion.finish_reason != "stop" or not completion.completion_ids:
        return None, len(completion.text)
    last = completion.completion_ids[-1]
    if last in params.stop_token_ids or last == eos:
        return (last if last != eos else None), None
    found = [(completion.text.find(s), s) for s in params.stop if s and s in completion.text]
    if not found:
        return None, len(completion.text)
    index, stop = min(found, key=lambda f: f[0] + len(f[1]))  # the first to complete
    return stop, index


def _text(completion: Completion, params: SamplingParams, tokenizer, eos: int | None,
          include_stop: bool):
    reason, cut = _stop_reason(completion, params, eos)
    if include_stop or completion.finish_reason != "stop":
        return completion.text, reason
    if cut is None:  # ended on a stop token: its text is left out
        return tokenizer.decode(completion.completion_ids[:-1], skip_special_tokens=False), \
            reason
    return completion.text[:cut], reason


def _choice(index: int, completion: Completion, request: GenerationRequest, tokenizer,
            body: CompletionBody) -> dict:
    if body.return_tokens_as_token_ids:
        tokens = [f"token_id:{t}" for t in completion.completion_ids]
    else:
        tokens = [tokenizer.decode([t], skip_special_tokens=False)
                  for t in completion.completion_ids]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    text, reason = _text(completion, request.params, tokenizer, tokenizer.eos_token_id,
                         body.include_stop_str_in_output)
    return {"index": index, "text": text, "finish_reason": completion.finish_reason,
            "stop_reason": reason,
            "logprobs": {"tokens": tokens, "token_logprobs": completion.logprobs,
                         "top_logprobs": None, "text_offset": offsets}}


def _raw_logprobs(model, completion) -> list[float]:
    """T = 1 logprobs of a completion's tokens, teacher-forced (what vLLM's raw mode reports)."""
    import torch

    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():
        logp = token_logprobs(model, ids)[0]
    return logp[len(completion.prompt_ids):].tolist()


def _sse(response: dict, include_usage: bool):
    """The completion as server-sent events: one chunk per choice, usage, ``[DONE]``."""
    head = {k: response[k] for k in ("id", "object", "created", "model")}
    for choice in response["choices"]:
        yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
    if include_usage:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': response['usage']})}\n\n"
    yield "data: [DONE]\n\n"


def create_app(engine: Engine, tokenizer, model_name: str = "mgrpo",
               logprobs_mode: str = "processed_logprobs", max_model_len: int | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app serving ``engine`` (its tokenizer decodes tokens and text prompts).
    ``max_model_len``: prompt + completion tokens a request may ask for (default: the
    model's ``max_position_embeddings``); ``max_body_bytes``: a request body's cap."""
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode={logprobs_mode!r}: use one of {LOGPROBS_MODES}")
    context, vocab = _model_limits(engine, tokenizer, max_model_len)
    app = FastAPI(title="mgrpo completions", version="1")
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    lock = threading.Lock()
    created = int(time.time())
    card = {"id": model_name, "object": "model", "created": created, "owned_by": "mgrpo",
            "max_model_len": context}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id}")
    def model(model_id: str) -> dict:
        if model_id != model_name:
            raise OpenAIError(404, f"model {model_id!r} is not served here; this server "
                                   f"serves {model_name!r}", param="model",
                              code="model_not_found")
        return card

    @app.get("/mgrpo/version")
    def version() -> dict:
        return {"version": engine.version}

    @app.post("/mgrpo/load_weights")
    def load_weights(body: LoadWeightsBody) -> dict:
        with lock:
            engine.load_weights(folder_weights(body.source), body.version)  # a plain HF folder
        return {"version": engine.version}

    @app.post("/v1/completions", response_model=None)
    def completions(body: CompletionBody) -> dict | StreamingResponse:
        if body.model not in (None, model_name):
            raise OpenAIError(404, f"model {body.model!r} is not served here; this server "
                                   f"serves {model_name!r}", param="model",
                              code="model_not_found")
        requests = _requests(body, tokenizer, context, vocab)
        with lock:
            outputs = engine.generate(requests)
            if logprobs_mode == "raw_logprobs":
                for c in outputs:
                    c.logprobs = _raw_logprobs(engine.model, c)
        choices = [_choice(i, c, r, tokenizer, body)
                   for i, (c, r) in enumerate(zip(outputs, requests, strict=True))]
        prompt_tokens = sum(len(r.prompt_ids) for r in requests)
        completion_tokens = sum(len(c.completion_ids) for c in outputs)
        response = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                    "created": int(time.time()), "model": model_name, "choices": choices,
                    "usage": {"prompt_tokens": prompt_tokens,
                              "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens}}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(response, include_usage),
                                     media_type="text/event-stream")
        return response

    return app
