"""``mgrpo serve control``: a Celery worker running the control-plane tasks
(``mgrpo.services.control.tasks``) from ``<prefix>mgrpo.control``, with the health server
every mgrpo service has (``/healthz``, ``/readyz``: the store answers, ``/metrics``: tasks done).

One task at a time (the solo pool, prefetch 1): control tasks are rare and each is a whole
job; more throughput means more replicas, which compete for the queue. Celery owns the main
thread and its signals: SIGTERM is a warm shutdown (the running task ends, then the process).

What this module does NOT do: hold task logic (``tasks``) or consume trajectories.
"""

from __future__ import annotations

import socket

from prometheus_client import CollectorRegistry, Gauge

from mgrpo.config import Settings
from mgrpo.services.context import Queues, load_service_config, make_bus, open_store
from mgrpo.services.control.tasks import (
    HANDLERS,
    ControlContext,
    control_app,
    register_control_tasks,
)
from mgrpo.services.dependencies import worker_needs
from mgrpo.services.health import serve_health
from mgrpo.services.process import setup_logging


def serve_control(settings: Settings) -> None:
    setup_logging(settings, "control")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    ctx = ControlContext(settings, store, bus, cfg, Queues(settings.queue_prefix))
    app = control_app(settings)
    register_control_tasks(app, ctx)
    worker = app.Worker(pool="solo", concurrency=1, queues=[app.conf.mgrpo_control_queue],
                        hostname=f"control@{socket.gethostname()}",
                        loglevel=settings.log_level.upper(), without_mingle=True,
                        without_gossip=True, optimization="fair")
    registry = CollectorRegistry()
    for name in HANDLERS:
        Gauge(f"mgrpo_control_{name.rsplit('.', 1)[-1]}_done", f"{name} tasks run to the end",
              registry=registry).set_function(lambda name=name: ctx.done.get(name, 0))
    server = serve_health(settings.health_port, registry, alive=lambda: True,
                          info=lambda: {"service": "control"}, not_ready=worker_needs(store))
    try:
        worker.start()  # blocks until a signal (warm shutdown)
    finally:
        server.shutdown()
        bus.close()
        store.close()
