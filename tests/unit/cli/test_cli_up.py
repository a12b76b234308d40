"""``mgrpo up`` checks the config, model folders and ports before starting anything, and
exits non-zero when a service dies. Before, a missing model folder surfaced 68 s later as
"subagent-searcher exited with 1; stopping all" and ``up`` exited 0."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import yaml

from mgrpo.services.launcher import ServiceProcesses


def _config(tmp_path, models, **extra):
    path = tmp_path / "run.yaml"
    bench = tmp_path / "bench"
    bench.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"models": models, "bench_dir": str(bench), **extra}))
    return path


def _up(config, *extra: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    # An unreachable database: if anything started, `db upgrade` would be what failed.
    env = {**os.environ, "MGRPO_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/x",
           **(env_extra or {})}
    env.pop("MGRPO_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", "up", "--config",
                           str(config), *extra], env=env, capture_output=True, text=True,
                          timeout=120)


def test_missing_model_folders_fail_before_anything_starts(tmp_path):
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "config.json").write_text("{}")
    models = {"planner": {"path": str(ok)}, "searcher": {"path": str(tmp_path / "gone")},
              "coder": {"path": str(tmp_path)}}
    done = _up(_config(tmp_path, models), "--api-port", "18654")
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert first == (f"error: model 'searcher': folder '{tmp_path / 'gone'}' does not exist; "
                     f"model 'coder': folder '{tmp_path}' has no config.json")
    assert "[up] started" not in done.stdout and "migrations" not in done.stderr


def test_a_config_typo_fails_in_one_line(tmp_path):
    done = _up(_config(tmp_path, {m: {"path": "x"} for m in ("planner", "searcher", "coder")},
                       kk=4))
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == ("error: invalid RunConfig: unknown key 'kk' (did "
                                           "you mean 'k'?)")


def _children(*argvs: tuple[str, ...]) -> ServiceProcesses:
    services = ServiceProcesses({**os.environ})
    for i, argv in enumerate(argvs):
        services.start(f"s{i}", *argv)
    return services


@pytest.mark.parametrize(("argv", "code"), [(("version",), 1), (("no-such-command",), 2)])
def test_supervise_exits_non_zero_when_a_service_dies(argv, code, capsys):
    """A service that ends by itself (even with 0) stops everything and makes ``up`` fail;
    a long-running sibling is stopped too."""
    from mgrpo.cli.up import supervise

    services = _children(argv, ("serve", "sandbox", "--port", "0"))
    assert supervise(services, threading.Event(), poll_s=0.1) == code
    assert services.dead() == ["s0", "s1"]
    assert "[up] s0 exited with" in capsys.readouterr().err


def test_supervise_exits_zero_on_a_stop_signal():
    from mgrpo.cli.up import supervise

    services = _children(("serve", "sandbox", "--port", "0"))
    stopping = threading.Event()
    stopping.set()
    assert supervise(services, stopping) == 0
    assert services.dead() == ["s0"]
