"""Model folders written by ``mgrpo models init-tiny`` are readable by other users (the
containers run as uid 10001). Before, model.safetensors was 0600 even under umask 022."""

from __future__ import annotations

import os
import stat

from typer.testing import CliRunner

from mgrpo.cli.main import app


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_tiny_writes_0644_files_and_0755_folders(tmp_path):
    out = tmp_path / "models" / "planner"
    old = os.umask(0o077)  # even a strict umask: the weights must stay readable
    try:
        result = CliRunner().invoke(app, ["models", "init-tiny", "--out", str(out)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert _mode(out / "model.safetensors") == 0o644
    assert _mode(out) == 0o755
    files = [p for p in out.iterdir() if p.is_file()]
    assert len(files) >= 5
    assert {p.name: _mode(p) for p in files} == {p.name: 0o644 for p in files}
