"""``mgrpo up``: which services it starts for a run config (a frozen model's trainer scores
it: main-only metrics as in embedded mode)."""

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
        "trainer-coder", "trainer-planner", "trainer-searcher"]


def test_single_agent_runs_without_subagent_services(tmp_path):
    """algorithm: grpo: the planner worker plays every role inline (issue 10 item 3)."""
    import yaml

    cfg = write_run_config(tmp_path / "run.yaml", Path("/m/tiny"), tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data.update(algorithm="grpo", models={"single": {"path": "/m/tiny"}},
                agents=dict.fromkeys(["planner", "searcher", "coder"], "single"))
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    names = [n for n, _ in service_commands(str(cfg), 8123)]
    assert names == ["planner", "planner-worker", "trainer-single"]


def test_at_grpo_runs_distributed_with_its_subagent_workers(tmp_path):
    """AT-GRPO's sub-agent subtrees are played by the sub-agent workers (tree calls over the
    bus): ``up`` starts them."""
    import yaml

    cfg = write_run_config(tmp_path / "run.yaml", Path("/m/tiny"), tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data["algorithm"] = "at_grpo"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    names = [n for n, _ in service_commands(str(cfg), 8123)]
    assert {"subagent-searcher", "subagent-coder", "trainer-planner"} <= set(names)
