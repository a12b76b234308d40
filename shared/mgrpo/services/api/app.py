"""The planner service's FastAPI app (docs/api.md). OpenAPI at ``/docs`` and ``/openapi.json``.

:func:`create_app` takes an :class:`~mgrpo.services.api.deps.ApiState` (tests pass their own
store and bus) or builds one from settings. Bad input gets 422 with one readable ``message``
line besides FastAPI's ``detail`` list; unknown ids 404; a round already running 409.

What this module does NOT do: run episodes for training rounds (the planner workers do; the
API only enqueues them) or train.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mgrpo.config import Settings
from mgrpo.services.api.deps import ApiState
from mgrpo.services.api.evaluation_worker import EvaluationWorker
from mgrpo.services.api.routes import (
    dashboard,
    evaluations,
    health,
    queries,
    registry,
    rounds,
)
from mgrpo.services.context import load_service_config, make_bus, open_store
from mgrpo.training.config import ModelConfig, RunConfig
from mgrpo.web.body_limit import BodySizeLimit
from mgrpo.web.docs_assets import install_offline_docs
from mgrpo.web.server import install_error_handlers


def build_state(settings: Settings) -> ApiState:
    store = open_store(settings)
    return ApiState(settings, load_service_config(settings), store, make_bus(settings, store))


def stalled_seconds(store) -> float:
    """The longest time without progress among unfinished rounds (a scrape while the store
    is down: -1, so the gauge never hides an outage as "no stall")."""
    try:
        return max(store.stalled_seconds().values(), default=0.0)
    except Exception:  # noqa: BLE001 - /readyz says why
        return -1.0


def create_app(state: ApiState | None = None, settings: Settings | None = None) -> FastAPI:
    state = state or build_state(settings or Settings())
    app = FastAPI(title="mgrpo planner API", version="1", docs_url=None, redoc_url=None,
                  description="Queries through the planner and its tool sub-agents; M-GRPO "
                  "training rounds; evaluations; the agent registry and checkpoints. Mutating "
                  "endpoints need 'Authorization: Bearer <MGRPO_API_TOKEN>'.")
    app.state.api = state
    app.state.registry = metrics_registry = CollectorRegistry()
    requests = Counter("mgrpo_api_requests", "HTTP requests by route and status",
                       ["route", "status"], registry=metrics_registry)
    seconds = Histogram("mgrpo_api_request_seconds", "Request duration", ["route"],
                        registry=metrics_registry)
    Gauge("mgrpo_round_stalled_seconds", "Seconds since the least recently progressing "
          "unfinished round progressed (0: none unfinished)",
          registry=metrics_registry).set_function(lambda: stalled_seconds(state.store))

    # A too-large body is refused before it is read and before the token check. Added before
    # the counter below, so it sits inside it: BaseHTTPMiddleware would turn the 413 raised
    # from a streamed body into a 400.
    app.add_middleware(BodySizeLimit, max_bytes=state.settings.max_body_bytes,
                       setting="MGRPO_MAX_BODY_BYTES")

    @app.middleware("http")
    async def count(request: Request, call_next):
        started = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        requests.labels(route, str(response.status_code)).inc()
        seconds.labels(route).observe(time.perf_counter() - started)
        return response

    install_error_handlers(app)  # 422 with a message, input never echoed

    for module in (health, queries, rounds, evaluations, registry, dashboard):
        app.include_router(module.router)
    install_offline_docs(app, "mgrpo planner API")
    # jobs of an API process that is gone: interrupted; this one's: interrupted when it stops
    app.router.on_startup.append(state.evaluations.on_startup)
    app.router.on_shutdown.append(state.evaluations.shutdown)
    if state.settings.evaluation_queue and state.store is not None:
        # evaluations as Celery tasks, played by a worker in this process (on its model)
        state.evaluation_worker = worker = EvaluationWorker(state)
        app.router.on_startup.append(worker.start)
        app.router.on_shutdown.append(worker.stop)
    app.router.on_shutdown.append(lambda: state.bus.close() if state.bus else None)
    app.router.on_shutdown.append(lambda: state.batcher.close() if state.batcher else None)
    return app


def openapi_document() -> dict:
    """The OpenAPI document, without touching a store or a broker (``docs/openapi.json``)."""
    stub = ApiState(Settings(), RunConfig(models={"planner": ModelConfig(path="-"),
                                                  "searcher": ModelConfig(path="-"),
                                                  "coder": ModelConfig(path="-")}),
                    store=None, bus=None)
    return create_app(stub).openapi()


if __name__ == "__main__":  # python -m mgrpo.services.api.app docs/openapi.json
    import json
    import sys

    with open(sys.argv[1], "w") as handle:
        json.dump(openapi_document(), handle, indent=2, sort_keys=True)
        handle.write("\n")
