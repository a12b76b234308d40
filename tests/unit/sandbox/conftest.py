"""Fixtures: a LocalSandbox, and the real sandbox service on a free port (uvicorn in a thread)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_testkit import running_server

from mgrpo.sandbox.local import LocalSandbox
from mgrpo.sandbox.service import SandboxServiceSettings


@pytest.fixture(scope="session")
def sandbox() -> LocalSandbox:
    return LocalSandbox()


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    from services.sandbox.app import create_app

    settings = SandboxServiceSettings(max_concurrency=8, max_queue=256)
    with running_server(create_app(settings)) as url:
        yield url
