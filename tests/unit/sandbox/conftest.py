"""Fixtures: a LocalSandbox per jail mode, and the real sandbox service on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_testkit import SANDBOX_MODES
from serving import running_server

from mgrpo.sandbox.local import LocalSandbox, SandboxLimits
from mgrpo.sandbox.service import SandboxServiceSettings


@pytest.fixture(scope="session", params=SANDBOX_MODES)
def sandbox(request) -> LocalSandbox:
    """One LocalSandbox per jail mode the host has: every hostile test runs in each."""
    return LocalSandbox(SandboxLimits(isolation=request.param))


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    from mgrpo.sandbox.app import create_app

    settings = SandboxServiceSettings(max_concurrency=8, max_queue=256)
    with running_server(create_app(settings)) as url:
        yield url
