"""Engine, sessions and the dialect-aware ``INSERT ... ON CONFLICT`` shared by the store parts.

PostgreSQL and SQLite both speak ``INSERT ... ON CONFLICT``; SQLAlchemy exposes it per dialect,
so :meth:`StoreBase._insert` picks the right ``insert`` construct. On SQLite every transaction
is ``BEGIN IMMEDIATE``: several in-thread workers (embedded mode) then queue on the database
lock (up to the busy timeout) instead of failing with "database is locked" when a reader
tries to become a writer. A file database runs in WAL mode with ``synchronous=NORMAL``
(SQLite's recommended pairing): a commit appends to the WAL without waiting for the disk, the
WAL is synced at checkpoints, so a killed process loses nothing committed and a power loss
may lose the last commits but never corrupts the database. The default (FULL) syncs on every
commit: ~7 ms each on this project's VM, most of an embedded round's ingest (four commits
per episode; docs/benchmarks.md "Asynchronous mode").

What this module does NOT do: define tables (``models``) or any query (the mixins).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event, func, literal_column
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

SUPPORTED_DIALECTS = ("postgresql", "sqlite")
SQLITE_BUSY_TIMEOUT_S = 60


def make_engine(url: str) -> Engine:
    """An engine for a PostgreSQL or SQLite URL; the SQLite file's folder is created."""
    parsed = make_url(url)
    dialect = parsed.get_backend_name()
    if dialect not in SUPPORTED_DIALECTS:
        raise ValueError(f"database URL {parsed.render_as_string(hide_password=True)!r} uses "
                         f"{dialect!r}; the stats store supports {SUPPORTED_DIALECTS}. Use e.g. "
                         "postgresql+psycopg://user@host/db or sqlite:///runs/mgrpo.db")
    if dialect == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    in_memory = parsed.database in (None, "", ":memory:")
    if not in_memory:
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        # One shared connection, else every thread would see its own empty in-memory database.
        poolclass=StaticPool if in_memory else None)
    _sqlite_immediate_transactions(engine, wal=not in_memory)
    return engine


def _sqlite_immediate_transactions(engine: Engine, *, wal: bool) -> None:
    # pysqlite's own BEGIN handling is disabled so that ours (IMMEDIATE) is the one used.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


class StoreBase:
    """Owns the engine; the mixins add the queries."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.closed = False  # set by close(): background loops on this store then end

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        """One short transaction: commit on success, roll back on any error."""
        with self._sessions.begin() as session:
            yield session

    def _clock(self):
        """Now, by the store's clock: ``now()`` in SQL on PostgreSQL, so that timestamps
        written by many machines (heartbeats) and the ages computed from them share one
        clock whatever each machine's says; SQLite is one machine's file: its clock."""
        if self.dialect == "postgresql":
            return func.now()
        # here, not at the top: an import circle through mgrpo.store.models
        from mgrpo.store.models import utcnow

        return utcnow()

    def _insert(self, model):
        module = postgresql if self.dialect == "postgresql" else sqlite
        return module.insert(model)

    @staticmethod
    def _written(session: Session, stmt) -> int:
        """Rows an INSERT ... ON CONFLICT or an UPDATE actually wrote.

        Counted with RETURNING: psycopg 3 reports ``rowcount == -1`` for these statements.
        """
        return len(session.execute(stmt.returning(literal_column("1"))).all())

    def close(self) -> None:
        self.closed = True
        self.engine.dispose()
