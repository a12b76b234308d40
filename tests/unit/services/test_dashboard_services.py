"""The dashboard on the planner service (issue 14): the distributed round's code path in one
process (in-memory bus, SQLite store, scripted policies that delegate, real trainers on tiny
models), the API with a token. In headless Chromium the page reads without a token, refuses
to start a round with a wrong one, starts one with the right one, draws the new round's
curves and shows an episode's sub-agent calls in the trace viewer."""

from __future__ import annotations

import os

import httpx
import pytest
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    write_run_config,
)
from serving import running_server
from waiting import wait_for

TOKEN = "dash-token"


@pytest.fixture(scope="module")
def api_url(tmp_path_factory):
    from mgrpo.services.api.app import create_app
    from mgrpo.services.api.deps import ApiState

    root = tmp_path_factory.mktemp("dashsvc")
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), name="svcdash", k=2, queries=2)
    settings = embedded_settings(root, cfg_path, api_token=TOKEN,
                                 tensorboard_dir=str(root / "tb"))
    with in_process_services(settings) as svc, \
            running_server(create_app(ApiState(settings, svc.cfg, svc.store, svc.bus))) as url:
        yield url, svc.store, root / "tb"


def test_reads_need_no_token_and_starting_needs_one(api_url):
    api_url = api_url[0]
    with httpx.Client(base_url=api_url, timeout=30) as client:
        assert client.get("/ui").status_code == 200
        assert client.get("/v1/dashboard").json() == {
            "mode": "embedded", "can_start_rounds": True, "token_required": True}
        assert client.get("/v1/runs").status_code == 200
        assert client.post("/v1/rounds", json={}).status_code == 401


def test_browser_starts_a_round_with_the_token_and_traces_subagents(api_url, tmp_path):
    from cdp_pipe import Browser, require_chromium

    require_chromium()
    submit = ("(() => { document.querySelector('#token').value = {token!r};"
              " document.querySelector('#start button').click(); return true; })()")
    api_url = api_url[0]
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{api_url}/ui?poll=300")
        browser.wait_for("document.body.dataset.polls >= 1", what="a first poll")
        assert browser.evaluate("document.querySelector('#start').hidden") is False
        browser.evaluate(submit.replace("{token!r}", "'wrong'"))
        msg = browser.wait_for("document.querySelector('#msg').textContent", what="a refusal")
        assert msg.startswith("HTTP 403"), msg
        browser.evaluate(submit.replace("{token!r}", repr(TOKEN)))
        msg = browser.wait_for("(t => t.startsWith('started') && t)"
                               "(document.querySelector('#msg').textContent)", what="a start")
        assert msg == "started svcdash-r0000"
        browser.wait_for("document.querySelector('#rounds tbody tr td:nth-child(3)')"
                         "?.textContent === 'done'", timeout=120, what="the round done")
        points = ("document.querySelector('[data-chart=\"reward\"] [data-key=\"{}\"]')"
                  "?.dataset.points")
        for key in ("planner/reward_mean", "searcher/reward_mean"):
            assert browser.wait_for(points.format(key), what=key) == "1"
        browser.wait_for("document.querySelectorAll('#episodes tbody tr').length === 4")
        browser.evaluate("document.querySelector('#episodes tbody tr').click()")
        browser.wait_for("document.querySelector('#trace')?.dataset.loaded", what="a trace")
        subs = browser.evaluate("[...document.querySelectorAll('#trace .turn.sub')]"
                                ".map(t => t.dataset.agent)")
        assert subs and set(subs) <= {"searcher", "coder"} and "searcher" in subs
        planner = browser.evaluate("document.querySelector('#trace .turn.planner pre.gen')"
                                   ".textContent")
        assert "<call>searcher|" in planner  # the planner's raw delegation, as generated
        shot = browser.screenshot(tmp_path / "dashboard_services.png")
    finally:
        browser.close()
    target = os.environ.get("MGRPO_SCREENSHOT_DIR")
    if target:
        shot.replace(os.path.join(target, "dashboard_services.png"))


def test_trainers_write_tensorboard_per_run_and_model(api_url):
    """MGRPO_TENSORBOARD_DIR: each trainer's round metrics as events in <dir>/<run>/<model>,
    equal to what it recorded in the store, and a few of its trajectories as text."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    url, store, tb = api_url
    if not store.list_rounds("svcdash"):  # run alone: start the round the browser test starts
        httpx.post(f"{url}/v1/rounds", json={}, timeout=60,
                   headers={"Authorization": f"Bearer {TOKEN}"}).raise_for_status()
    wait_for(lambda: store.list_rounds("svcdash")[0].status == "done", 120, poll_s=0.2)
    round_id = store.list_rounds("svcdash")[0].round_id
    recorded = store.metrics("svcdash", round_id)[round_id]
    assert sorted(p.name for p in (tb / "svcdash").iterdir()) == ["coder", "planner", "searcher"]
    for model in ("planner", "searcher"):
        events = EventAccumulator(str(tb / "svcdash" / model))
        events.Reload()
        key = f"{model}/pg_loss"
        (scalar,) = events.Scalars(key)
        assert scalar.step == 0
        assert scalar.value == pytest.approx(recorded[key], rel=1e-6)
        assert f"{model}/trajectories" in events.Tags()["scalars"]
    # log_completions (2) of each trainer's trajectories, decoded, in the text tab
    events = EventAccumulator(str(tb / "svcdash" / "searcher"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("completions/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    assert text.step == 0 and shown.count("searcher #") == 2 and ">> " in shown
