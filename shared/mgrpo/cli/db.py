"""`mgrpo db ...` commands: the migration job (Alembic, shipped in the package; docs/deploy.md,
'Upgrades and migrations').

The URL is ``--url`` or the ``MGRPO_DATABASE_URL`` setting. What this does NOT do: create the
PostgreSQL database itself (the URL's database must exist; SQLite files are created).
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)

URL_OPTION = typer.Option(None, "--url", help="SQLAlchemy URL; default: MGRPO_DATABASE_URL.")


def _url(url: str | None) -> str:
    if url:
        return url
    # on use: keeps the library out of the CLI's start
    from mgrpo.config import get_settings

    return get_settings().database_url


@app.command()
def upgrade(url: str | None = URL_OPTION,
            revision: str = typer.Option("head", help="Target Alembic revision.")) -> None:
    """Apply the stats-store migrations (alembic upgrade); safe to run repeatedly."""
    # on use: keeps sqlalchemy out of the CLI's start
    from mgrpo.store import Store

    store = Store(_url(url))
    try:
        store.upgrade(revision)
        typer.echo(f"database at revision {store.current_revision()}")
    finally:
        store.close()


@app.command()
def current(url: str | None = URL_OPTION) -> None:
    """Print the database's revision and the code's head revision."""
    # on use: keeps sqlalchemy out of the CLI's start
    from mgrpo.store import Store
    from mgrpo.store.migrate import head_revision

    store = Store(_url(url))
    try:
        typer.echo(f"current: {store.current_revision() or '(none: run mgrpo db upgrade)'}")
        typer.echo(f"head:    {head_revision()}")
    finally:
        store.close()
