"""Process plumbing shared by the worker entry points: logging, the health server with a few
Prometheus gauges, and blocking until SIGTERM/SIGINT.

What this module does NOT do: any service logic.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from mgrpo.config import Settings
from mgrpo.services.health import serve_health


def setup_logging(settings: Settings, service: str) -> None:
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")


def serve_until_signal(settings: Settings, service: str, gauges: dict[str, Callable[[], float]],
                       stop: Callable[[], None] | None = None, bus=None) -> None:
    """Serve /healthz, /readyz and /metrics on ``settings.health_port``; block until
    SIGTERM/SIGINT. ``bus``: its consumers decide health (``mgrpo.services.health``): one not
    consuming for ``settings.consumer_grace_s`` makes /healthz 503; /readyz is 503 at once."""
    registry = CollectorRegistry()
    for name, read in gauges.items():
        Gauge(name, name.replace("_", " "), registry=registry).set_function(read)
    stopped = threading.Event()
    check = getattr(bus, "consumer_problems", None)
    server = serve_health(
        settings.health_port, registry, alive=lambda: not stopped.is_set(),
        info=lambda: {"service": service},
        problems=(lambda: check(settings.consumer_grace_s)) if check else None,
        not_ready=(lambda: check(0.0)) if check else None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    logging.getLogger(service).info("%s ready; health on :%d", service,
                                    server.server_address[1])
    stopped.wait()
    if stop is not None:
        stop()
    server.shutdown()
