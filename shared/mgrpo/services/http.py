"""HTTP pieces every FastAPI app of ours shares (planner API, sandbox service)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    """422 with the fields at fault and one readable ``message``. The input itself is never
    echoed back: it may be 10 MB of code, or not even encodable UTF-8."""
    detail = [{"loc": list(e["loc"]), "msg": e["msg"].removeprefix("Value error, "),
               "type": e["type"]} for e in err.errors()]  # our validators' text, as written
    message = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)
    return JSONResponse(status_code=422, content={"detail": detail, "message": message})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
