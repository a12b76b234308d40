"""``mgrpo up``: which services it starts for a run config (frozen models get no trainer)."""

from __future__ import annotations

from pathlib import Path

from services_testkit import write_run_config

from mgrpo.cli.up import service_commands


def test_up_starts_one_process_per_service(tmp_path):
    cfg = write_run_config(tmp_path / "run.yaml", Path("/m/tiny"), tmp_path, frozen=("coder",))
    commands = dict(service_commands(str(cfg), 8123))
    assert commands["planner"] == ["serve", "planner", "--host", "127.0.0.1", "--port", "8123"]
    assert commands["subagent-coder"] == ["serve", "subagent", "--name", "coder", "--tool",
                                          "python", "--model", "/m/tiny"]
    assert sorted(n for n in commands if n.startswith("trainer-")) == [
        "trainer-planner", "trainer-searcher"]
