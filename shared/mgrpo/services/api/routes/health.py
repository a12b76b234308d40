"""``/healthz`` (the process is up and can serve queries), ``/readyz`` (the store, the broker
and this process's bus consumers answer), ``/metrics`` (Prometheus).

``/healthz`` runs on the event loop and reads in-memory state only (no lock, no I/O), so it
answers while the model thread plays batches. It is 503 when the model thread died, or when
a bus consumer of this process (the planner's reply queue, started by the first query) has
not consumed for ``MGRPO_CONSUMER_GRACE_S``: delegations would wait for replies that never
come, so an orchestrator should restart the process. ``/readyz`` is 503 at once for those.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mgrpo.services.api.deps import State

router = APIRouter(tags=["health"])


def process_problems(state, grace_s: float) -> list[str]:
    """Why this process cannot serve queries: its bus consumers (a consumer thread that died,
    or one disconnected for ``grace_s``) and its model thread. In memory, no I/O."""
    check = getattr(state.bus, "consumer_problems", None)
    problems = list(check(grace_s)) if check is not None else []
    if state.batcher is not None and (problem := state.batcher.problem()) is not None:
        problems.append(problem)
    return problems


@router.get("/healthz", summary="Liveness: the model thread and the bus consumers are alive",
            responses={503: {"description": "A bus consumer or the model thread is dead (or "
                             "a consumer was disconnected for longer than the grace period)"}})
async def healthz(state: State) -> JSONResponse:  # async: on the event loop, never queued
    problems = process_problems(state, state.settings.consumer_grace_s)
    if problems:
        return JSONResponse({"status": "down", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/readyz", summary="Readiness: the store, the broker and the bus consumers answer",
            responses={503: {"description": "The store or the broker does not answer, or a "
                             "bus consumer of this process is not consuming"}})
def readyz(state: State) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        state.store.current_revision()
        checks["store"] = "ok"
    except Exception as error:  # any failure means not ready; say which
        checks["store"] = f"{type(error).__name__}: {error}"
    if state.settings.mode == "distributed":
        checks["broker"] = _broker_ok(state.settings.broker_url)
    problems = process_problems(state, 0.0)
    checks["consumers"] = "; ".join(problems) if problems else "ok"
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
