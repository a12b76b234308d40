"""Weaker isolation modes still run code, enforce the wall clock and clean up their work dir."""

from __future__ import annotations

import os

import pytest

from mgrpo.sandbox.isolation import mode_works
from mgrpo.sandbox.local import LocalSandbox, SandboxLimits
from mgrpo.sandbox.types import ExecRequest


@pytest.mark.parametrize("mode", ["none", "userns"])
def test_fallback_mode_runs_code_in_a_temp_dir_that_is_removed(mode):
    if not mode_works(mode):
        pytest.skip("no user namespaces on this host")
    sandbox = LocalSandbox(SandboxLimits(isolation=mode))
    result = sandbox.execute(ExecRequest(code="import os\nprint(os.getcwd())"))
    work_dir = result.stdout.strip()
    assert result.status == "ok" and "mgrpo-sandbox-" in work_dir
    assert not os.path.exists(work_dir)
    slow = sandbox.execute(ExecRequest(code="import time\ntime.sleep(30)", timeout_s=0.5))
    assert slow.status == "timeout"
