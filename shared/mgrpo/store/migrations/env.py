"""Alembic environment of the stats store (run by ``Store.upgrade`` and ``mgrpo db upgrade``).

The URL comes from the Alembic config's ``sqlalchemy.url`` (set in code, there is no
alembic.ini), or an open connection passed in ``config.attributes["connection"]``.
``render_as_batch`` makes ALTER TABLE work on SQLite (copy-and-move), so the same revisions
run on PostgreSQL and SQLite. Offline (SQL script) mode is not supported.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from mgrpo.store.models import Base

config = context.config


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("mgrpo store migrations run online only: give a database URL")
run_migrations_online()
