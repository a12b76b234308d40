"""The live deployment tier: the compose stack built and started for real (docs/deploy.md,
"A machine without Docker Hub"), one stack for the whole module.

As root on Linux it installs and starts its own Docker engine (docker/test/engine.sh), builds
the images (docker/test/build-images.sh; cached under MGRPO_DEPLOY_CACHE, default
/var/cache/mgrpo-deploy, so a second run reuses them), brings the cpu profile up, and tears
it all down afterwards, also when a step fails: containers, volumes, networks, and the daemon
if this run started it (with the host's iptables and ip_forward restored). Where no engine can
run it skips with the reason; under CI=true it fails instead. MGRPO_DEPLOY_LIVE=0 skips it.
"""

from __future__ import annotations

import fcntl
import os

import live_stack
import pytest
from live_stack import (
    CACHE,
    ROOT,
    Compose,
    Engine,
    Phases,
    run,
    why_no_engine,
    write_project,
)

PHASES = Phases()


def pytest_terminal_summary(terminalreporter):
    if PHASES.times:
        terminalreporter.section("live deployment tier: phase times")
        for name, seconds in PHASES.times.items():
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")


@pytest.fixture(scope="session")
def phases(request):
    live_stack.CAPTURE = request.config.pluginmanager.getplugin("capturemanager")
    return PHASES


@pytest.fixture(scope="module")
def stack(phases):
    """(Compose, .env values, Store on the stack's Postgres) of the running cpu profile."""
    reason = why_no_engine()
    if reason:
        if os.environ.get("CI", "").lower() == "true" and reason != "MGRPO_DEPLOY_LIVE=0":
            pytest.fail(f"the live deployment tier cannot run here: {reason} (CI=true)",
                        pytrace=False)
        pytest.skip(f"live deployment tier: {reason}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "tier.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one tier at a time on this machine
        engine = Engine()
        compose = None
        try:
            with phases("engine (install + dockerd)"):
                env = engine.start()
            with phases("images (base, python, stand-ins, project targets)"):
                run([str(ROOT / "docker" / "test" / "build-images.sh")], env=env, timeout=2400)
            with phases("project folder (tiny models, benchmark, .env)"):
                folder = CACHE / "project"
                compose = Compose(folder, env)
                compose("down", "-v", "--remove-orphans", check=False)  # a crashed run's
                values = write_project(folder)
            with phases("compose up --wait (cpu profile)"):
                compose.up()
            from mgrpo.store import Store

            store = Store(f"postgresql+psycopg://mgrpo:{values['POSTGRES_PASSWORD']}"
                          f"@127.0.0.1:{values['DEPLOY_TEST_PG_PORT']}/mgrpo")
            yield compose, values, store
            store.close()
        finally:
            with phases("teardown (compose down -v, dockerd)"):
                if compose is not None:
                    compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False)
                engine.stop()
