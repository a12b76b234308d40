"""Process plumbing shared by the worker entry points: logging, the health server with a few
Prometheus gauges, and blocking until SIGTERM/SIGINT.

What this module does NOT do: any service logic.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from mgrpo.config import Settings
from mgrpo.logs import setup_logging as setup_log_handlers
from mgrpo.sandbox.service import SandboxServiceSettings
from mgrpo.services.health import serve_health
from mgrpo.validation import env_names, unknown_env_vars

SETTINGS_ENV = env_names(Settings, SandboxServiceSettings)
"""Every ``MGRPO_*`` variable a settings class reads (the services' and the sandbox's)."""


def setup_logging(settings: Settings, service: str) -> None:
    """Log handlers for ``service``, then a warning per ``MGRPO_*`` variable no settings
    class reads."""
    setup_log_handlers(service, settings.log_level)
    for message in unknown_env_vars(dict(os.environ), SETTINGS_ENV):
        logging.getLogger(service).warning(message)


def exit_now(code: int = 0) -> None:
    """End a service process at once, after its orderly stop: flush the logs, then skip the
    interpreter's teardown. Freeing torch and the loaded models took 5-8 s per process at
    exit (measured under load), so ``mgrpo up`` with six children needed ~30 s to stop;
    nothing is left to persist by then (bus closed, store writes committed)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve_until_signal(settings: Settings, service: str, gauges: dict[str, Callable[[], float]],
                       stop: Callable[[], None] | None = None, bus=None,
                       needs: Callable[[], list[str]] | None = None) -> None:
    """Serve /healthz, /readyz and /metrics on ``settings.health_port``; block until
    SIGTERM/SIGINT. ``bus``: its consumers decide health (``mgrpo.services.health``): one not
    consuming for ``settings.consumer_grace_s`` makes /healthz 503; /readyz is 503 at once.
    ``needs``: what else the worker needs, checked by each /readyz probe (the store, the
    sandbox, the checkpoint disk: ``mgrpo.services.dependencies``); a problem makes /readyz
    503 with it, not /healthz (a restart would not bring a database back)."""
    registry = CollectorRegistry()
    for name, read in gauges.items():
        Gauge(name, name.replace("_", " "), registry=registry).set_function(read)
    stopped = threading.Event()
    check = getattr(bus, "consumer_problems", None)

    def not_ready() -> list[str]:
        return (check(0.0) if check else []) + (needs() if needs else [])

    server = serve_health(
        settings.health_port, registry, alive=lambda: not stopped.is_set(),
        info=lambda: {"service": service},
        problems=(lambda: check(settings.consumer_grace_s)) if check else None,
        not_ready=not_ready)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    logging.getLogger(service).info("%s ready; health on :%d", service,
                                    server.server_address[1])
    stopped.wait()
    started = time.monotonic()
    logging.getLogger(service).info("%s stopping", service)
    if stop is not None:
        stop()
    server.shutdown()
    logging.getLogger(service).info("%s stopped in %.1f s", service, time.monotonic() - started)
