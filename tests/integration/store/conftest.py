import pytest

from mgrpo.store import Store
from mgrpo.store.admin import temporary_database


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
