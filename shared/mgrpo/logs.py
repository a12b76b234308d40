"""One logging set-up for every mgrpo process: the same line format, one level, and the
libraries' routine chatter quieted.

Every service (``mgrpo serve ...``, via ``mgrpo.services.process.setup_logging``, and the
sandbox) calls :func:`setup_logging`, so lines from the planner API, its workers and the
trainers read alike (``mgrpo up`` prefixes each with the process name too). uvicorn's own
loggers are routed here (``log_config=None``) instead of its separate format.

What this module does NOT do: configure the one-shot commands (``train``, ``eval``, ...):
they print their results and progress bars themselves, and warnings still reach stderr.
Nor does it write files or ship logs anywhere; processes log to stderr and
the platform (docker, Kubernetes, ``mgrpo up``) collects them.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s {process} %(levelname)s %(name)s: %(message)s"

# Routine per-start or per-call messages that bury ours at INFO: alembic logs seven lines
# per migration check, bm25s sets its own logger to DEBUG, httpx logs every request.
QUIET = ("alembic", "bm25s", "httpx", "httpcore", "urllib3", "kombu", "amqp", "celery",
         "filelock", "sqlalchemy.engine")


class _QuietLibraries(logging.Filter):
    """Drop records of the :data:`QUIET` libraries below ``level``. A filter on the handler,
    not logger levels: bm25s resets its own logger to DEBUG when it builds an index."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            return True
        return not any(record.name == n or record.name.startswith(n + ".") for n in QUIET)


def setup_logging(process: str = "mgrpo", level: str = "INFO") -> None:
    """Configure the root logger (replacing an earlier set-up) for ``process``."""
    logging.basicConfig(level=level.upper(), format=FORMAT.format(process=process), force=True)
    # A record propagated from a library logger skips the root's level, so the quiet level
    # must never be below the one asked for.
    quiet_level = max(logging.WARNING, logging.getLevelNamesMapping().get(level.upper(), 0))
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietLibraries(quiet_level))
    for name in QUIET:
        logging.getLogger(name).setLevel(quiet_level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()  # uvicorn's default handlers print their own format
        logger.propagate = True
