"""HTTP pieces every FastAPI app of ours shares (planner API, sandbox service, dashboard):
error handlers and the options every one of them is served with (:func:`server_options`)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

KEEP_ALIVE_S = 75
"""Seconds an idle keep-alive connection stays open on our servers. Longer than any client
keeps an idle connection for reuse (httpx: 5 s, cloud load balancers: 60 s): a server that
closes an idle connection at the moment a client sends the next request on it makes that
request fail with "connection reset" although the server never read it. uvicorn's own
default, 5 s, equals httpx's: with it, any httpx client that reuses a connection after about
5 s idle can meet that race."""


def server_options(**options) -> dict:
    """uvicorn's options for every server of ours: ``uvicorn.run(app, **server_options(
    host=..., port=...))`` (or ``uvicorn.Config``)."""
    return {"timeout_keep_alive": KEEP_ALIVE_S, **options}


async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    """422 with the fields at fault and one readable ``message``. The input itself is never
    echoed back: it may be 10 MB of code, or not even encodable UTF-8."""
    detail = [{"loc": list(e["loc"]), "msg": e["msg"].removeprefix("Value error, "),
               "type": e["type"]} for e in err.errors()]  # our validators' text, as written
    message = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)
    return JSONResponse(status_code=422, content={"detail": detail, "message": message})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
