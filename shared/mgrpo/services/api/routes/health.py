"""``/healthz`` (the process is up), ``/readyz`` (the store and the broker answer),
``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mgrpo.services.api.deps import State

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict:  # async: answered on the event loop, never queued for a thread
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the store and the broker answer",
            responses={503: {"description": "The store or the broker does not answer"}})
def readyz(state: State) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        state.store.current_revision()
        checks["store"] = "ok"
    except Exception as error:  # any failure means not ready; say which
        checks["store"] = f"{type(error).__name__}: {error}"
    if state.settings.mode == "distributed":
        checks["broker"] = _broker_ok(state.settings.broker_url)
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ok else "not ready", "checks": checks},
                        status_code=200 if ok else 503)


def _broker_ok(url: str) -> str:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
        return "ok"
    except Exception as error:
        return f"{type(error).__name__}: {error}"


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}},
                             "description": "Prometheus text exposition format"}})
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
