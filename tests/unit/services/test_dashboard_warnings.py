"""The dashboard's warnings banner reads ``/v1/runs/{run_id}/warnings``: the run-watch lines
``mgrpo train`` printed (zero reward variance, grad_norm 0, format collapse, a sub-agent never
called), replayed over the stored round metrics. Before, a run whose groups all had zero
reward variance for every round showed nothing but flat curves."""

from __future__ import annotations

from fastapi.testclient import TestClient

from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.training.config import ModelConfig, RunConfig

MODELS = ("planner", "searcher", "coder")


def _client(store) -> TestClient:
    cfg = RunConfig(models={m: ModelConfig(path="-") for m in MODELS})
    return TestClient(create_app(ApiState(Settings(), cfg, store=store, bus=None)))


def test_warnings_of_a_run_that_learns_nothing(store):
    config = RunConfig(models={m: ModelConfig(path="-", trainable=m != "coder")
                               for m in MODELS}).model_dump(mode="json")
    store.create_run("flat", "flat", config)
    for index in range(4):
        round_id = f"flat-r{index:04d}"
        store.create_round("flat", round_id, index, ["q"], 2, config)
        store.record_metrics("flat", round_id, {
            "planner/frac_reward_zero_std": 1.0, "planner/reward_mean": 0.0,
            "planner/grad_norm": 0.0, "planner/format_valid": 1.0,
            "searcher/frac_reward_zero_std": 0.5, "searcher/grad_norm": 0.1,
            "searcher/calls_per_episode": 0.0 if index else 1.0,
            "coder/calls_per_episode": 0.0})  # coder is frozen: not warned
    warnings = _client(store).get("/v1/runs/flat/warnings").json()
    assert [(w["round"], w["text"].split(":")[1].strip()) for w in warnings] == [
        (2, "planner"), (3, "searcher was not called in 3 rounds (searcher/calls_per_episode=0)")]
    assert warnings[0]["text"].startswith("warning: planner: every group had the same reward")


def test_a_healthy_run_has_none_and_an_unknown_run_is_404(store):
    store.create_run("fine", "fine", {})
    store.create_round("fine", "fine-r0000", 0, ["q"], 2, {})
    store.record_metrics("fine", "fine-r0000", {"planner/frac_reward_zero_std": 0.25,
                                                "planner/grad_norm": 0.3})
    client = _client(store)
    assert client.get("/v1/runs/fine/warnings").json() == []
    assert client.get("/v1/runs/nope/warnings").status_code == 404


def test_runs_say_their_true_status(store, tmp_path):
    """/v1/runs said `running` for a finished run: its stored status is set at creation."""
    import json
    import socket
    import subprocess
    import sys

    from mgrpo.dashboard.data import list_runs
    from mgrpo.training.run_lock import LOCK_FILE

    config = RunConfig(models={m: ModelConfig(path="-") for m in MODELS},
                       stages=[{"stage": 1, "rounds": 2}]).model_dump(mode="json")
    for run_id, statuses in (("finished", ["done", "done"]), ("live", ["done", "running"]),
                             ("stopped", ["done"])):
        store.create_run(run_id, run_id, config)
        for index, status in enumerate(statuses):
            round_id = f"{run_id}-r{index:04d}"
            store.create_round(run_id, round_id, index, ["q"], 2, config)
            store.set_round_status(round_id, status)
    runs = {r["run_id"]: r for r in _client(store).get("/v1/runs").json()}
    assert {k: (r["status"], r["rounds_done"], r["rounds_planned"]) for k, r in runs.items()} \
        == {"finished": ("done", 2, 2), "live": ("running", 1, 2), "stopped": ("idle", 1, 2)}
    # an embedded run between rounds (evaluating) holds its folder: running
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": child.pid, "started": 0,
                                                      "host": socket.gethostname()}))
        assert {r["run_id"]: r["status"] for r in list_runs(store, tmp_path)}["stopped"] \
            == "running"
    finally:
        child.kill()
        child.wait()
    assert {r["run_id"]: r["status"] for r in list_runs(store, tmp_path)}["stopped"] == "idle"


def test_a_stalled_round_is_warned_about(store):
    """An unfinished round without progress for ``stalled_after_s`` (default 300 s) gets a
    banner line; a finished one never does."""
    store.create_run("slow", "slow", {})
    store.create_round("slow", "slow-r0000", 0, ["q"], 2, {}, running=True)
    store.create_round("slow", "slow-r0001", 1, ["q2"], 2, {}, running=True)
    store.set_round_status("slow-r0001", "done")
    client = _client(store)
    assert client.get("/v1/runs/slow/warnings").json() == []  # not 300 s yet
    warnings = client.get("/v1/runs/slow/warnings?stalled_after_s=0").json()
    assert [w["round"] for w in warnings] == [0]
    assert warnings[0]["text"].startswith("warning: round slow-r0000 has made no progress")


def test_browser_shows_what_the_run_is_and_its_warnings(store, tmp_path):
    """Headless Chromium: the header line, the warnings banner, the run's status in the run
    list and an agent without samples marked in the reward chart."""
    from cdp_pipe import Browser, require_chromium
    from serving import running_server

    require_chromium()
    config = RunConfig(models={m: ModelConfig(path=f"/models/{m}") for m in MODELS},
                       stages=[{"stage": 1, "rounds": 5}]).model_dump(mode="json")
    store.create_run("flat", "flat", config)
    for index in range(4):
        round_id = f"flat-r{index:04d}"
        store.create_round("flat", round_id, index, ["q"], 2, config)
        store.record_metrics("flat", round_id, {"planner/frac_reward_zero_std": 1.0,
                                                "planner/reward_mean": 0.0,
                                                "planner/grad_norm": 0.0})
        store.set_round_status(round_id, "done")
    cfg = RunConfig(models={m: ModelConfig(path="-") for m in MODELS})
    app = create_app(ApiState(Settings(), cfg, store=store, bus=None))
    browser = Browser(tmp_path / "profile")
    try:
        with running_server(app) as url:
            browser.open(f"{url}/ui?run=flat&poll=300")
            header = browser.wait_for(
                "document.querySelector('#summary').textContent.includes('rounds 4/5') && "
                "document.querySelector('#summary').textContent", what="the header")
            assert header.startswith("flat: mgrpo | K=8 | B=16 | rounds 4/5 (idle) | models: "
                                     "planner (/models/planner)")
            banner = browser.wait_for("!document.querySelector('#warnings').hidden && "
                                      "document.querySelector('#warnings li').textContent",
                                      what="the warnings banner")
            assert banner.startswith("round 2: warning: planner: every group had the same "
                                     "reward for 3 rounds")
            assert browser.evaluate("document.querySelector('#run option').textContent") \
                == "flat (idle, 4/5 rounds)"
            marked = ("document.querySelector('[data-chart=\"reward\"] "
                      "[data-key=\"searcher/reward_mean (no samples)\"]')?.dataset.points")
            assert browser.wait_for(marked, what="searcher marked") == "0"
    finally:
        browser.close()
