"""Request body size limit for every HTTP service of ours (planner API, sandbox service).

:class:`BodySizeLimit` is plain ASGI middleware, outermost, so it runs before FastAPI reads
or parses the body and before any dependency (the bearer token check) runs:

- a ``Content-Length`` above the limit gets 413 at once; the body is never read;
- a malformed ``Content-Length`` gets 400;
- a body without a length (chunked) is counted as it streams in, and the request is cut off
  with 413 as soon as it passes the limit, so at most ``limit`` bytes are ever held.

Why: FastAPI reads and parses the whole JSON body before its dependencies run, so without
this a 300 MB request without a token was buffered (API 341 -> 1,222 MB) before its 401.

What this module does NOT do: limit the number or rate of requests (see ``backpressure``).
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException


class BodyTooLarge(HTTPException):
    """The streamed body passed the limit. Raised from ``receive``; an HTTPException so that
    FastAPI's body parser passes it on (it turns other errors into 400) and the app answers
    413 itself."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


def _reply(status: int, message: str):
    body = json.dumps({"detail": message}).encode()
    return [{"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")]},
            {"type": "http.response.body", "body": body}]


class BodySizeLimit:
    """ASGI middleware: refuse request bodies over ``max_bytes`` with 413."""

    def __init__(self, app, max_bytes: int, setting: str = "max_body_bytes") -> None:
        self.app, self.max_bytes, self.setting = app, max_bytes, setting

    def _too_large(self) -> str:
        return (f"request body larger than {self.max_bytes} bytes (the service's "
                f"{self.setting}); send a smaller body")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
                if length < 0:
                    raise ValueError
            except ValueError:
                for message in _reply(400, "malformed Content-Length header"):
                    await send(message)
                return
            if length > self.max_bytes:
                for message in _reply(413, self._too_large()):
                    await send(message)
                return

        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self._too_large())
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if started:  # the app answered without reading it all: nothing more to say
                return
            for message in _reply(413, self._too_large()):
                await send(message)
