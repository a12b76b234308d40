import sys
from pathlib import Path

import pytest

from mgrpo.store import Store
from mgrpo.store.admin import temporary_database

# store_contracts: the checks shared with the SQLite tests
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "store"))


@pytest.fixture(scope="session")
def pg_database_url(postgres_url):
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    with temporary_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def pg_store(pg_database_url):
    store = Store(pg_database_url)
    store.upgrade()
    yield store
    store.close()
