"""Create and drop whole PostgreSQL databases (tests, one-off set-up), outside any transaction.

What this module does NOT do: migrations (``Store.upgrade``) or anything on SQLite, where a
database is just a file.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

_SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _admin_execute(server_url: str, sql: str) -> None:
    # CREATE/DROP DATABASE cannot run in a transaction block: autocommit.
    engine = create_engine(make_url(server_url).set(database="postgres"),
                           isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(sql))
    finally:
        engine.dispose()


def create_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``server_url``; returns its URL."""
    if not _SAFE_NAME.match(name):
        raise ValueError(f"database name {name!r} must match {_SAFE_NAME.pattern} "
                         "(lower-case letters, digits, underscores)")
    _admin_execute(server_url, f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever is still connected (PostgreSQL >= 13)."""
    if not _SAFE_NAME.match(name):
        raise ValueError(f"database name {name!r} must match {_SAFE_NAME.pattern}")
    _admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def temporary_database(server_url: str, prefix: str = "mgrpo_test") -> Iterator[str]:
    """A fresh, empty database ``<prefix>_<random>`` for the block; dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = create_database(server_url, name)
    try:
        yield url
    finally:
        drop_database(server_url, name)
