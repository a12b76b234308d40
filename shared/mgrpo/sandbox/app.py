"""The tool-sandbox service's app: ``POST /v1/execute``, ``/healthz``, ``/readyz``,
``/metrics`` (``mgrpo serve sandbox``; ``services/sandbox/app.py`` is its container shell).

All isolation lives in :class:`mgrpo.sandbox.local.LocalSandbox`; the queue in
:class:`mgrpo.sandbox.service.ConcurrencyGate`. This file only maps HTTP to them: 422 for a
bad body (FastAPI's validation, each error with its ``msg``) or a ``memory_mb`` above the
service's ``max_memory_mb``, 429 with ``Retry-After`` when the queue is full, 413 for a body
over ``max_body_bytes`` (before it is read).
It has no authentication: run it on a private network only (see docs/sandbox.md).
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from mgrpo.sandbox.local import LimitExceeded, LocalSandbox, SandboxLimits
from mgrpo.sandbox.service import ConcurrencyGate, QueueFull, SandboxServiceSettings
from mgrpo.sandbox.types import ExecRequest, ExecResult
from mgrpo.web.body_limit import BodySizeLimit
from mgrpo.web.docs_assets import install_offline_docs
from mgrpo.web.server import install_error_handlers

READY_TTL_S = 10.0  # /readyz runs its self-test at most this often


def _self_test(sandbox: LocalSandbox) -> str | None:
    """None when the sandbox runs ``print('ready')``; else why not."""
    try:
        result = sandbox.execute(ExecRequest(code="print('ready')", timeout_s=10))
    except Exception as error:  # noqa: BLE001 - any failure means not ready; say which
        return f"self-test: {type(error).__name__}: {str(error)[:200]}"
    if result.status != "ok" or result.stdout.strip() != "ready":
        return (f"self-test: status {result.status}, exit {result.exit_code}: "
                f"{(result.stderr or result.stdout)[-200:]}")
    return None


def create_app(settings: SandboxServiceSettings | None = None,
               sandbox: LocalSandbox | None = None) -> FastAPI:
    settings = settings or SandboxServiceSettings()
    sandbox = sandbox or LocalSandbox(SandboxLimits(
        output_limit_bytes=settings.output_limit_bytes, max_processes=settings.max_processes,
        max_concurrent=settings.max_concurrency, max_memory_mb=settings.max_memory_mb))
    gate = ConcurrencyGate(settings.max_concurrency, settings.max_queue)
    registry = CollectorRegistry()  # per app, so tests can build several
    calls = Counter("sandbox_calls", "Finished calls by status", ["status"], registry=registry)
    rejected = Counter("sandbox_rejected", "Calls refused with 429", registry=registry)
    seconds = Histogram("sandbox_call_seconds", "Duration of a call (in the sandbox)",
                        registry=registry)
    Gauge("sandbox_running", "Calls running", registry=registry).set_function(
        lambda: gate.running)
    Gauge("sandbox_queued", "Calls waiting", registry=registry).set_function(
        lambda: gate.waiting)

    app = FastAPI(title="mgrpo tool sandbox", version="1", docs_url=None, redoc_url=None)
    app.state.gate, app.state.sandbox = gate, sandbox
    app.router.on_shutdown.append(gate.close)

    install_error_handlers(app)  # 422 with a message, input never echoed
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       setting="MGRPO_SANDBOX_MAX_BODY_BYTES")
    install_offline_docs(app, "mgrpo tool sandbox")

    @app.post("/v1/execute", response_model=ExecResult)
    async def execute(request: ExecRequest):
        try:
            result = await gate.run(sandbox.execute, request)
        except QueueFull as err:
            rejected.inc()
            return JSONResponse(status_code=429, content={"detail": str(err)},
                                headers={"Retry-After": str(err.retry_after_s)})
        except LimitExceeded as err:
            return JSONResponse(status_code=422, content={"detail": str(err), "message": str(err)})
        calls.labels(result.status).inc()
        seconds.observe(result.duration_s)
        return result

    @app.get("/healthz")
    async def healthz() -> dict:  # on the event loop: never waits for a busy thread
        return {"status": "ok", "isolation": sandbox.mode, "running": gate.running,
                "queued": gate.waiting}

    ready = {"at": -READY_TTL_S, "problem": None}  # the last self-test, at most every TTL

    @app.get("/readyz")
    def readyz() -> JSONResponse:  # a thread: the self-test runs code
        """200 when a call would be accepted and run: the queue has room and a self-test
        (``print('ready')``, at most every READY_TTL_S) ran in the sandbox; else 503 with
        the problems."""
        problems = []
        if gate.admitted >= gate.max_concurrency + gate.max_queue:
            problems.append(f"queue full: {gate.running} running, {gate.waiting} waiting")
        if time.monotonic() - ready["at"] >= READY_TTL_S:
            ready["problem"] = _self_test(sandbox)
            ready["at"] = time.monotonic()
        if ready["problem"]:
            problems.append(ready["problem"])
        body = {"status": "not ready" if problems else "ready", "isolation": sandbox.mode}
        if problems:
            body["problems"] = problems
        return JSONResponse(body, status_code=503 if problems else 200)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
