"""The training dashboard: ``/ui`` and its read endpoints over a real embedded run.

A real ``run_training`` on tiny models (one round, real gradient steps) leaves ``store.db``
and ``metrics.csv``; ``mgrpo ui``'s app serves them. The browser test drives headless
Chromium (Debian's ``chromium``) over ``--remote-debugging-pipe``: it sees the reward curve
gain a point while a second round runs, and opens an episode's trace.
"""

from __future__ import annotations

import os

import httpx
import pytest
from services_testkit import make_bench, make_tiny
from serving import running_server

from mgrpo.training.config import RunConfig


def _cfg(root, tiny, bench, rounds: int) -> RunConfig:
    models = {m: {"path": str(tiny), "lr": 1e-3, "micro_batch_size": 4}
              for m in ("planner", "searcher", "coder")}
    return RunConfig.model_validate({
        "name": "dash", "seed": 0, "algorithm": "mgrpo", "models": models, "k": 2,
        "queries_per_round": 2, "stages": [{"stage": 1, "rounds": rounds}],
        "sampling": {"planner_max_turns": 2, "subagent_max_turns": 2, "max_new_tokens": 6},
        "eval_questions": 1, "bench_dir": str(bench), "out_dir": str(root / "run")})


@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory):
    """A finished one-round embedded run; yields (run_dir, cfg for a second round)."""
    from mgrpo.training.loop import run_training

    root = tmp_path_factory.mktemp("dash")
    tiny, bench = make_tiny(root / "tiny"), make_bench(root / "bench")
    run_training(_cfg(root, tiny, bench, rounds=1), progress=False)
    return root / "run", _cfg(root, tiny, bench, rounds=2)


@pytest.fixture(scope="module")
def ui_url(embedded_run):
    from mgrpo.cli.ui import ui_app

    with running_server(ui_app(embedded_run[0])) as url:
        yield url


def test_read_endpoints_show_the_run(ui_url):
    with httpx.Client(base_url=ui_url, timeout=30) as client:
        assert client.get("/ui").text.startswith("<!doctype html>")
        info = client.get("/v1/dashboard").json()
        assert info == {"mode": "embedded", "can_start_rounds": False, "token_required": True}
        assert [r["run_id"] for r in client.get("/v1/runs").json()] == ["dash"]
        # the header: what the run is, how far it got, before/after
        summary = client.get("/v1/runs/dash/summary").json()
        assert {k: summary[k] for k in ("algorithm", "k", "queries_per_round", "rounds_done",
                                        "rounds_planned", "status")} == {
            "algorithm": "mgrpo", "k": 2, "queries_per_round": 2, "rounds_done": 1,
            "rounds_planned": 1, "status": "done"}
        assert set(summary["models"]) == {"planner", "searcher", "coder"}
        assert set(summary["eval"]) == {"before", "after"}
        assert 0 <= summary["eval"]["after"]["eval/greedy/accuracy"] <= 1
        rounds = client.get("/v1/runs/dash/rounds").json()
        first = rounds[0]
        assert first["index"] == 0 and first["status"] == "done"
        assert first["rollouts_completed"] == first["rollouts_total"] == 4  # B=2 x K=2
        assert first["duration_s"] > 0
        assert "planner" in first["published_models"]
        charts = client.get("/v1/runs/dash/metrics").json()["charts"]
        assert charts["reward"]["planner/reward_mean"][0][0] == 0
        # every agent is in the reward chart: one without samples is marked, not missing
        assert {k.split("/")[0] for k in charts["reward"]} == {"planner", "searcher", "coder"}
        assert all(not points for k, points in charts["reward"].items()
                   if k.endswith("(no samples)"))
        # the CSV adds the eval curve the store does not hold: before (step 0), after (1)
        assert [p[0] for p in charts["accuracy"]["eval/greedy/accuracy"]][:2] == [0, 1]
        assert "planner/clipfrac" in charts["clip fraction"]
        # a planner that never delegates: 0 calls, drawn (the chart said "no data yet")
        assert charts["calls per episode"]["searcher/calls_per_episode"][0] == [0, 0.0]
        assert "planner/frac_reward_zero_std" in charts["groups with zero reward variance"]
        assert "planner/rollout_logp_diff_mean" in charts["train/inference logprob mismatch"]
        groups = client.get(f"/v1/rounds/{first['round_id']}/group_stats").json()
        planner = next(g for g in groups if g["agent"] == "planner")
        assert planner["groups"] == 2 and planner["samples"] == 4  # 2 queries x K=2
        ckpts = client.get("/v1/runs/dash/checkpoints").json()
        assert {(c["model"], c["version"]) for c in ckpts} >= {("planner", 1), ("coder", 1)}
        # an embedded checkpoint names the round it was written after (it had none)
        by_version = {c["version"]: c["round_id"] for c in ckpts if c["model"] == "planner"}
        assert by_version[1] == first["round_id"]
        episodes = client.get(f"/v1/rounds/{first['round_id']}/episodes").json()
        assert len(episodes) == 4 and all(e["question"] for e in episodes)


def test_trace_decodes_planner_and_subagent_turns(ui_url, embedded_run):
    from mgrpo.store import Store

    store = Store(f"sqlite:///{embedded_run[0] / 'store.db'}")
    round_id = store.list_rounds("dash")[0].round_id
    with httpx.Client(base_url=ui_url, timeout=60) as client:
        episodes = client.get(f"/v1/rounds/{round_id}/episodes").json()
        one = episodes[0]
        trace = client.get(f"/v1/rounds/{round_id}/episodes/{one['query_id']}/"
                           f"{one['rollout']}").json()
    stored = store.episode_trajectories(round_id, one["query_id"], one["rollout"])
    assert trace["question"] == one["question"] and trace["outcome"]["reward"] == one["reward"]
    assert len(trace["planner"]) == sum(t.agent == "planner" for t in stored) == 1
    assert len(trace["subagents"]) == sum(t.agent != "planner" for t in stored)
    planner = trace["planner"][0]
    assert planner["decoded"] is True
    # spans alternate prompt / generated and cover every stored token
    assert sum(s["tokens"] for s in planner["spans"]) == len(
        next(t for t in stored if t.agent == "planner").input_ids)
    assert planner["spans"][0]["generated"] is False and any(
        s["generated"] for s in planner["spans"])


def test_completions_show_a_few_episodes_per_round_as_text(ui_url, embedded_run):
    """The Completions panel reads completions.jsonl (log_completions: 2 per round)."""
    with httpx.Client(base_url=ui_url, timeout=30) as client:
        shown = client.get("/v1/runs/dash/completions").json()
        assert 'id="completions"' in client.get("/ui").text
        assert client.get("/v1/runs/nobody/completions").status_code == 404
    assert [c["round"] for c in shown] == [0, 0]
    for c in shown:
        assert c["text"].startswith(f"episode {c['query_id']} #{c['rollout']}   reward ")
        assert "\nquestion: " in c["text"]


def test_unknown_ids_are_404_and_bad_ids_422(ui_url):
    with httpx.Client(base_url=ui_url, timeout=30) as client:
        assert client.get("/v1/runs/nope/metrics").status_code == 404
        assert client.get("/v1/rounds/nope/episodes").status_code == 404
        assert client.get("/v1/runs/..%2Fetc/rounds").status_code in (404, 422)
        bad = client.get("/v1/rounds/x y/episodes")
        assert bad.status_code == 422 and "round id" in bad.json()["message"]


def test_embedded_ui_is_read_only(ui_url):
    with httpx.Client(base_url=ui_url, timeout=30) as client:
        assert client.post("/v1/rounds", json={}).status_code == 401
        assert client.post("/v1/queries", json={"question": "hi"}).status_code == 401


def test_browser_sees_a_new_point_and_opens_a_trace(embedded_run, ui_url, tmp_path):
    from cdp_pipe import Browser, require_chromium
    from PIL import Image

    from mgrpo.training.loop import run_training

    require_chromium()
    series = ('document.querySelector(\'[data-chart="reward"] '
              '[data-key="planner/reward_mean"]\')?.dataset.points')
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{ui_url}/ui?poll=300")
        assert browser.wait_for(series, what="the reward curve") == "1"
        run_training(embedded_run[1], resume=True, progress=False)  # round 1, page open
        assert browser.wait_for(f"{series} === '2'", what="a second point") is True
        browser.wait_for("document.querySelectorAll('#episodes tbody tr').length === 4")
        browser.evaluate("document.querySelector('#episodes tbody tr').click()")
        browser.wait_for("document.querySelector('#trace')?.dataset.loaded", what="a trace")
        assert browser.evaluate("document.querySelectorAll('#trace .turn.planner').length") == 1
        panel = "document.querySelectorAll('#completions pre.gen').length === 4"
        assert browser.wait_for(panel, what="both rounds' completions") is True
        generated = browser.evaluate("document.querySelectorAll('#trace pre.gen').length")
        assert generated >= 1
        # The metrics of round 1 are written before it is marked done, so a poll between the
        # two shows its point with the round still 'training'; the next poll says 'done'.
        statuses = ("[...document.querySelectorAll('#rounds tbody tr')]"
                    ".map(r => r.children[2].textContent).join(',')")
        assert browser.wait_for(f"{statuses} === 'done,done'", what="both rounds done") is True
        shot = browser.screenshot(tmp_path / "dashboard.png")
    finally:
        browser.close()
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # not a blank page
    target = os.environ.get("MGRPO_SCREENSHOT_DIR")  # make screenshots: docs/img
    if target:
        (tmp_path / "dashboard.png").replace(os.path.join(target, "dashboard.png"))


def test_mgrpo_ui_command_serves_the_run(embedded_run, tmp_path):
    """``mgrpo ui RUN_DIR`` as a user runs it (a process); a folder that is not a run is one
    line of error."""
    import re
    import subprocess
    import sys
    import time

    from mgrpo.services.launcher import free_port

    cli = [sys.executable, "-m", "mgrpo.cli.main", "ui"]
    bad = subprocess.run([*cli, str(tmp_path)], capture_output=True, text=True, timeout=120)
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", bad.stderr).split())  # unwrap the error box
    assert bad.returncode == 2 and "has no store.db: pass the out_dir" in said, bad.stderr
    port = free_port()
    proc = subprocess.Popen([*cli, str(embedded_run[0]), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, runs = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                runs = httpx.get(f"http://127.0.0.1:{port}/v1/runs", timeout=5).json()
                break
            except httpx.TransportError:
                time.sleep(0.3)
        assert runs is not None and [r["run_id"] for r in runs] == ["dash"]
        assert "dashboard" in httpx.get(f"http://127.0.0.1:{port}/ui", timeout=5).text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_embedded_round_in_progress_shows_running(embedded_run, tmp_path):
    """The embedded loop opens a round before sampling it: the dashboard must show it as
    running (it showed ``pending`` until the round was done)."""
    from mgrpo.cli.ui import ui_app
    from mgrpo.envs import load_benchmark
    from mgrpo.store import Store
    from mgrpo.training.loop import open_round

    cfg = embedded_run[1]
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    store = Store(f"sqlite:///{run_dir / 'store.db'}")
    store.upgrade()
    store.create_run("dash", "dash", cfg.model_dump(mode="json"))
    questions = load_benchmark(cfg.bench_dir).questions("train", stage=1)[:2]
    # what run_round does before sampling
    open_round(store, cfg, "dash", 0, [q.id for q in questions])
    with running_server(ui_app(run_dir)) as url:
        (live,) = httpx.get(f"{url}/v1/runs/dash/rounds", timeout=30).json()
    assert live["status"] == "running"
    assert store.get_round(live["round_id"]).started_at is not None
    store.close()


def test_chart_axis_labels_of_small_values_are_readable(ui_url, tmp_path):
    """The logprob-mismatch chart's values are ~1e-7: its y labels read 0.000000 before."""
    from cdp_pipe import Browser, require_chromium

    require_chromium()
    labels = ("[...drawChart('m', {a: %s}).querySelectorAll('svg > text')]"
              ".map((t) => t.textContent)")
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{ui_url}/ui?poll=300")
        browser.wait_for("typeof drawChart === 'function'", what="the page script")
        # y1, y0, then the x labels
        assert browser.evaluate(labels % "[[0, 1e-7], [1, 3e-7]]") == [
            "3.00e-7", "1.00e-7", "0", "1"]
        assert browser.evaluate(labels % "[[0, 0], [1, 2.5e-7]]")[:2] == ["2.5e-7", "0"]
        assert browser.evaluate(labels % "[[0, 0.1], [1, 0.9]]")[:2] == ["0.900", "0.100"]
        assert browser.evaluate(labels % "[[0, 0], [1, 250000]]")[:2] == ["2.5e+5", "0"]
    finally:
        browser.close()
