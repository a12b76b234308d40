"""Which store errors are the database's fault (transient) and which are the data's.

A restart of PostgreSQL, a dropped connection or a full connection pool says nothing about the
message being handled: the work must be retried, never dead-lettered. A constraint violation or
a value PostgreSQL refuses (a NUL byte in a text column) would fail again on every retry: those
are the message's fault.

What this module does NOT do: retry anything (the bus decides; ``mgrpo.bus.errors``).
"""

from __future__ import annotations

from sqlalchemy import exc as sa_exc

from mgrpo.errors import register_transient_check


@register_transient_check  # the bus retries work that failed on these (mgrpo.bus.errors)
def is_transient_db_error(error: BaseException) -> bool:
    """True when ``error`` means "the database is (momentarily) unreachable or restarting"."""
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    # OperationalError: connection refused/reset, server shutting down, admin termination,
    # too many clients; InterfaceError: the connection is closed; pool timeout: all busy.
    if isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError
                  | sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency of distributed mode
        return False
    return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)


class RunBusy(RuntimeError):
    """A round cannot be created: the run has other unfinished rounds (``round_ids``)."""

    def __init__(self, run_id: str, round_ids: list[str]) -> None:
        super().__init__(f"run {run_id!r} has unfinished rounds {round_ids}")
        self.run_id, self.round_ids = run_id, round_ids
