"""Fixtures: a LocalSandbox per jail mode, and the real sandbox service on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_testkit import REMOTE_URL, SANDBOX_MODES, RemoteSandbox
from serving import running_server

from mgrpo.sandbox.local import LocalSandbox, SandboxLimits
from mgrpo.sandbox.service import SandboxServiceSettings


@pytest.fixture(scope="session", params=SANDBOX_MODES)
def sandbox(request) -> LocalSandbox | RemoteSandbox:
    """One LocalSandbox per jail mode the host has: every hostile test runs in each. With
    MGRPO_TEST_SANDBOX_URL, the running service there instead."""
    if REMOTE_URL:
        return RemoteSandbox(REMOTE_URL)
    return LocalSandbox(SandboxLimits(isolation=request.param))


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    if REMOTE_URL:
        yield REMOTE_URL
        return
    from mgrpo.sandbox.app import create_app

    settings = SandboxServiceSettings(max_concurrency=8, max_queue=256)
    with running_server(create_app(settings)) as url:
        yield url
