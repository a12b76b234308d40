import pytest

from mgrpo.store import Store


@pytest.fixture
def store(tmp_path):
    """A migrated SQLite store in a fresh temp folder."""
    store = Store(f"sqlite:///{tmp_path}/store.db")
    store.upgrade()
    yield store
    store.close()
