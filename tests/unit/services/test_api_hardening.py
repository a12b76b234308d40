"""Hostile input, request size limits and backpressure at the planner's REST API (issue 16
items 6-8), over a real uvicorn on a free port, with the real store and in-process sub-agent
workers. The planner is the scripted policy with a gate (``gated_engine``): closed, its
turns wait, so queries can be held in flight while we probe the service."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import services_testkit as kit
from services_testkit import (
    in_memory_backend,
    make_bench,
    make_tiny,
    raw_http,
    write_run_config,
)
from serving import running_server

from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.training.config import StageConfig

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IN_FLIGHT = 3
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening")
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), k=2, queries=2)
    settings = Settings(mode="distributed", database_url=f"sqlite:///{root}/store.db",
                        run_config=str(cfg_path), api_token=TOKEN,
                        engine="services_testkit:gated_engine",
                        max_queries_in_flight=IN_FLIGHT, max_body_bytes=BODY_LIMIT)
    cfg, store, bus = in_memory_backend(settings)
    state = ApiState(settings, cfg, store, bus)
    with running_server(create_app(state)) as url:
        yield url, state


@pytest.mark.parametrize("params", [
    {"alive_within_s": "1e11"}, {"alive_within_s": "inf"}, {"alive_within_s": "nan"},
    {"alive_within_s": "-1"}, {"alive_within_s": "1e400"},
])
def test_non_finite_and_huge_ages_are_422(api, params):
    response = httpx.get(f"{api[0]}/v1/agents", params=params)
    assert response.status_code == 422, response.text
    assert "alive_within_s" in response.json()["message"]


@pytest.mark.parametrize("path, params, field", [
    ("/v1/rounds", {"run_id": "a\x00b"}, "run_id"),
    ("/v1/rounds", {"run_id": "r" * 200}, "run_id"),
    ("/v1/rounds", {"run_id": "../other"}, "run_id"),
    ("/v1/rounds/a%00b", {}, "round_id"),
    ("/v1/rounds/" + "r" * 300, {}, "round_id"),
    ("/v1/checkpoints", {"model": "a\x00"}, "model"),
    ("/v1/checkpoints", {"model": "../planner"}, "model"),
    ("/v1/checkpoints", {"model": "/etc/passwd"}, "model"),
    ("/v1/checkpoints", {"model": "runs/models/planner"}, "model"),
])
def test_nul_long_and_path_like_names_are_422(api, path, params, field):
    response = httpx.get(f"{api[0]}{path}", params=params)
    assert response.status_code == 422, response.text
    message = response.json()["message"]
    assert field in message and "not a path" in message


def test_nul_in_bodies_is_422(api):
    url = api[0]
    response = httpx.post(f"{url}/v1/queries", json={"question": "who\x00"}, headers=AUTH)
    assert response.status_code == 422 and "NUL" in response.json()["message"]
    response = httpx.post(f"{url}/v1/rounds", json={"run_id": "x\x00"}, headers=AUTH)
    assert response.status_code == 422 and "run_id" in response.json()["message"]
    assert httpx.post(f"{url}/v1/rounds/a%00b/cancel", headers=AUTH).status_code == 422


def test_a_non_ascii_token_is_403_not_500(api):
    response = httpx.post(f"{api[0]}/v1/rounds", json={},
                          headers={"Authorization": "Bearer s\u00e9cret".encode("latin-1")})
    assert response.status_code == 403


def test_a_round_larger_than_the_training_pool_is_refused(api):
    url, state = api
    pool = len(state.benchmark().questions("train", stage=state.cfg.stages[0].stage))
    response = httpx.post(f"{url}/v1/rounds", json={"run_id": "too-big",
                                                    "queries_per_round": pool + 1},
                          headers=AUTH)
    assert response.status_code == 422, response.text
    assert f"training pool of curriculum stage 1 ({pool} questions" in response.json()["message"]
    assert httpx.get(f"{url}/v1/rounds", params={"run_id": "too-big"}).json() == []


def test_every_curriculum_stage_pool_is_checked_not_only_the_first(api):
    """Stage 1 here draws from benchmark stage 2 (39 questions), stage 2 from benchmark
    stage 1 (21): B=30 fits the first stage only, so the round is refused up front."""
    url, state = api
    bench = state.benchmark()
    big, small = (len(bench.questions("train", stage=s)) for s in (2, 1))
    assert small < big
    original = state.cfg
    state.cfg = original.model_copy(update={"stages": [
        StageConfig(stage=2, rounds=1), StageConfig(stage=1, rounds=1)]})
    try:
        response = httpx.post(f"{url}/v1/rounds", json={"run_id": "stage-two-too-small",
                                                        "queries_per_round": small + 1},
                              headers=AUTH)
    finally:
        state.cfg = original
    assert response.status_code == 422, response.text
    message = response.json()["message"]
    assert f"training pool of curriculum stage 2 ({small} questions" in message
    assert httpx.get(f"{url}/v1/rounds", params={"run_id": "stage-two-too-small"}).json() == []


def test_a_turn_team_round_larger_than_its_world_training_tasks_is_refused(api):
    """A turn team's pool is its world's training tasks (``workflow.train_tasks``), not the
    benchmark's."""
    from mgrpo.training.config import RunConfig

    url, state = api
    original = state.cfg
    model = next(iter(original.models.values())).path
    state.cfg = RunConfig.model_validate({
        "name": original.name, "models": {"m": {"path": model}}, "k": 2,
        "workflow": {"kind": "turn_team", "world": "plan_path",
                     "roles": {"tool": "m", "plan": "m"}, "train_tasks": 4}})
    try:
        response = httpx.post(f"{url}/v1/rounds", json={"run_id": "team-too-big",
                                                        "queries_per_round": 5},
                              headers=AUTH)
    finally:
        state.cfg = original
    assert response.status_code == 422, response.text
    assert "larger than the world's training tasks (workflow.train_tasks: 4)" in \
        response.json()["message"]
    assert httpx.get(f"{url}/v1/rounds", params={"run_id": "team-too-big"}).json() == []


def test_a_declared_huge_body_is_413_before_it_is_sent_or_the_token_checked(api):
    head = ("POST /v1/queries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 300000000\r\n\r\n")
    status, sent = raw_http(api[0], head)  # no body at all: the server must not wait for it
    assert (status, sent) == (413, 0)


def test_a_streamed_huge_body_is_cut_off_at_the_limit(api):
    head = ("POST /v1/queries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * 16384
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 640  # 10 MB, no token
    status, sent = raw_http(api[0], head, chunks)
    assert status == 413
    assert sent < len(chunks) * len(chunks[0]) // 4, "the server read the whole body first"


def test_a_body_under_the_limit_still_reaches_auth(api):
    response = httpx.post(f"{api[0]}/v1/queries", json={"question": "x" * 1000})
    assert response.status_code == 401


def test_queries_beyond_the_limit_get_429_while_health_and_reads_answer(api):
    url, state = api
    kit.PLANNER_BATCHES.clear()
    kit.PLANNER_GATE.clear()
    try:
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            held = [pool.submit(httpx.post, f"{url}/v1/queries", headers=AUTH, timeout=120,
                                json={"question": f"What is the population of Velmora {i}?"})
                    for i in range(IN_FLIGHT)]
            for _ in range(2400):  # the first query also loads the planner (slow when busy)
                if state.batcher is not None and state.batcher.in_flight == IN_FLIGHT:
                    break
                kit.time.sleep(0.05)
            assert state.batcher.in_flight == IN_FLIGHT
            assert httpx.get(f"{url}/healthz", timeout=30).json() == {"status": "ok"}
            assert httpx.get(f"{url}/v1/rounds", timeout=30).status_code == 200
            refused = httpx.post(f"{url}/v1/queries", json={"question": "one more"},
                                 headers=AUTH, timeout=30)
            kit.PLANNER_GATE.set()
            answered = [f.result() for f in held]
    finally:
        kit.PLANNER_GATE.set()
    assert refused.status_code == 429
    assert f"max_in_flight={IN_FLIGHT}" in refused.json()["detail"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert [r.status_code for r in answered] == [200] * IN_FLIGHT
    assert all(r.json()["answer"] for r in answered)
    # played together, not one after the other: some planner turn had several rows
    assert max(kit.PLANNER_BATCHES) >= 2
    assert state.batcher.in_flight == 0
    assert math.isfinite(state.batcher.last_batch_s)


def evaluate(url: str, body: dict, timeout_s: float = 300.0) -> dict:
    """Start an evaluation (202), poll it until it is no longer running; its last state."""
    started = httpx.post(f"{url}/v1/evaluations", json=body, headers=AUTH, timeout=60)
    assert started.status_code == 202, started.text
    assert started.headers["Location"] == f"/v1/evaluations/{started.json()['evaluation_id']}"
    deadline = kit.time.monotonic() + timeout_s
    while kit.time.monotonic() < deadline:
        job = httpx.get(f"{url}{started.headers['Location']}", timeout=60).json()
        if job["status"] != "running":
            return job
        kit.time.sleep(0.1)
    raise AssertionError(f"evaluation still running after {timeout_s} s: {job}")


def test_a_second_evaluation_of_the_same_questions_answers(api):
    """Sub-agents drop a call id they answered before; evaluations used fixed ids, so the
    second one waited out every delegation's 300 s time-out."""
    url = api[0]
    body = {"n_questions": 3, "split": "test"}
    first, second = evaluate(url, body), evaluate(url, body)
    assert (first["status"], second["status"]) == ("done", "done"), second
    assert first["played"] == first["n_questions"] == 3
    assert first["result"] == second["result"]  # same questions, seeds and weights
    assert first["result"]["n"] == 3


def test_evaluation_ids_unknown_and_malformed(api):
    url = api[0]
    response = httpx.get(f"{url}/v1/evaluations/{'0' * 32}")
    assert response.status_code == 404 and "does not exist" in response.json()["detail"]
    response = httpx.get(f"{url}/v1/evaluations/..%2Fx")
    assert response.status_code in (404, 422)
    assert httpx.get(f"{url}/v1/evaluations/nothex").status_code == 422
    assert httpx.post(f"{url}/v1/evaluations", json={}).status_code == 401
