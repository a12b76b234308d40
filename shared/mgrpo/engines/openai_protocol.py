"""The OpenAI-compatible edge of :mod:`mgrpo.engines.openai_server`: request bodies with a
bound on every field, OpenAI-style error bodies, and a cap on the request body's size.

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which the
official ``openai`` client reads into its exceptions: 400 ``invalid_request_error`` for a
value out of bounds (``param`` names the field), 404 for an unknown model or path, 413 for a
body over the cap, 500 ``server_error`` (no traceback) for anything unexpected.

What it does NOT do: authentication, rate limits, or per-client quotas.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1  # seeds: torch.Generator's range, as vLLM's
MIN_TEMPERATURE = 0.01  # below it (but not 0: greedy) logits / T overflow float32
MAX_TEMPERATURE = 100.0
MAX_N = 64  # completions per prompt
MAX_PROMPTS = 256  # prompts per request
MAX_SEQUENCES = 256  # prompts x n per request
MAX_STOPS = 16  # stop strings (OpenAI allows 4; vLLM more)
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_BODY_BYTES = 4 * 2**20  # a request body's cap (a context of token ids is ~6 B a token)


class OpenAIError(Exception):
    """An error answered as OpenAI's ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type_)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, **fields) -> JSONResponse:
    return JSONResponse(error_body(message, **fields), status_code=status)


Token = Annotated[int, Field(ge=0)]  # < the vocabulary size: checked against the tokenizer


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionBody(BaseModel):
    """``POST /v1/completions``. Unknown fields are ignored (as vLLM does); OpenAI's fields
    this server cannot honour are refused when set to anything but their no-op value."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, max_length=256)
    prompt: (list[Annotated[list[int], Field(max_length=2**20)]] | list[int] | list[str]
             | str) = Field(description="token ids, a list of them, text, or a list of texts")
    max_tokens: int | None = Field(16, ge=1, description="None: up to the context length")
    temperature: float = Field(1.0, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1, le=2**31 - 1, description="-1 or 0: off")
    stop: (Annotated[str, Field(max_length=MAX_STOP_CHARS)]
           | Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]],
                       Field(max_length=MAX_STOPS)] | None) = None
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    seed: int | None = Field(None, ge=LONG_MIN, le=LONG_MAX)
    n: int = Field(1, ge=1, le=MAX_N)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    return_tokens_as_token_ids: bool = False
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI fields this server does not implement: only their no-op values are accepted
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = Field(None, max_length=MAX_STOP_CHARS)
    logit_bias: dict[str, float] | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    user: str | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _supported(self) -> CompletionBody:
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={self.temperature}: use 0 (greedy) or a value in "
                             f"[{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]")
        if self.seed is not None and self.seed + self.n - 1 > LONG_MAX:
            raise ValueError(f"seed={self.seed} with n={self.n}: completion j uses seed + j, "
                             f"which must stay <= {LONG_MAX}")
        if isinstance(self.prompt, list) and len(self.prompt) > MAX_PROMPTS \
                and not isinstance(self.prompt[0], int):
            raise ValueError(f"{len(self.prompt)} prompts: at most {MAX_PROMPTS} a request")
        refused = {"echo": self.echo, "suffix": self.suffix is not None,
                   "logit_bias": bool(self.logit_bias),
                   "best_of": self.best_of not in (None, 1, self.n),
                   "presence_penalty": self.presence_penalty != 0,
                   "frequency_penalty": self.frequency_penalty != 0,
                   "logprobs": (self.logprobs or 0) > 0}
        names = [name for name, on in refused.items() if on]
        if names:
            raise ValueError(f"{', '.join(names)}: not supported by this server (it returns "
                             "the sampled token's logprob only, logprobs=0)")
        return self


def _param(loc: tuple) -> str | None:
    """The request field a validation error is about (``body.max_tokens`` -> ``max_tokens``)."""
    parts = [str(p) for p in loc if p != "body"]
    return parts[0] if parts else None


def install_error_handlers(app: FastAPI) -> None:
    """Every error of ``app`` in OpenAI's shape; validation errors are 400, as OpenAI's."""

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return error_response(error.status, error.message, type_=error.type,
                              param=error.param, code=error.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first: dict[str, Any] = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where \
            else first.get("msg", "invalid request")
        return error_response(400, message, param=_param(tuple(first.get("loc", ()))))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if error.status_code == 404 else None
        return error_response(error.status_code, str(error.detail), code=code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(error).__name__}",
                              type_="server_error")


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 (OpenAI's shape)
    before the app sees it. The body is read to its end (up to 64 x the cap) so the client
    gets the answer rather than a broken connection."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more and size <= 64 * self.max_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size <= self.max_bytes:
                chunks.append(body)
            more = message.get("more_body", False)
        if size > self.max_bytes:
            response = error_response(
                413, f"request body over {self.max_bytes} bytes: send fewer or shorter "
                "prompts (token ids are smaller than text)", code="request_too_large")
            await response(scope, receive, send)
            return
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
