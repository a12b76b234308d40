"""``MGRPO_PLUGINS`` is imported by ``mgrpo`` before any command runs (services included); a
module that cannot be imported, or a mistyped spec in a run config, is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _mgrpo(*argv: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MGRPO_DEBUG"} | env_extra
    return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", *argv], env=env,
                          capture_output=True, text=True, timeout=120)


def test_mgrpo_plugins_env_is_imported_before_the_command(tmp_path):
    (tmp_path / "acme_hello.py").write_text("import sys\nprint('acme loaded', file=sys.stderr)\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    done = _mgrpo("version", MGRPO_PLUGINS="acme_hello", PYTHONPATH=path)
    assert done.returncode == 0 and "acme loaded" in done.stderr
    done = _mgrpo("version", MGRPO_PLUGINS="acme_hello,acme_nowhere", PYTHONPATH=path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[1] == (
        "error: MGRPO_PLUGINS: 'acme_nowhere': no module named 'acme_nowhere' (is "
        "its folder on PYTHONPATH or the package installed?)")


def test_a_mistyped_verifier_path_in_the_run_config_is_one_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"models": MODELS, "verifier": "os.path:joyn"}))
    done = _mgrpo("train", "--config", str(config))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("error: invalid RunConfig: ") and "verifier: 'os.path:joyn': " \
        "'os.path' has no attribute 'joyn'" in first
