"""The REST API with TestClient: auth, bad input, 404/409, rounds, registry, health, metrics,
a query answered through the planner and in-process sub-agent workers, and the committed
OpenAPI document matching the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from services_testkit import in_memory_backend, make_bench, make_tiny, write_run_config

from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), k=2, queries=2)
    settings = Settings(mode="distributed", database_url=f"sqlite:///{root}/store.db",
                        run_config=str(cfg_path), api_token=TOKEN,
                        engine="services_testkit:scripted_engine")
    cfg, store, bus = in_memory_backend(settings)
    app = create_app(ApiState(settings, cfg, store, bus))
    with TestClient(app) as test_client:
        yield test_client


def test_mutating_endpoints_need_the_token(client):
    assert client.post("/v1/rounds", json={}).status_code == 401
    response = client.post("/v1/rounds", json={}, headers={"Authorization": "Bearer nope"})
    assert response.status_code == 403 and "does not match" in response.json()["detail"]
    assert client.post("/v1/queries", json={"question": "x"}).status_code == 401
    assert client.post("/v1/rounds/x/cancel").status_code == 401
    assert client.get("/v1/rounds").status_code == 200  # reads are open


def test_bad_input_gets_422_with_a_message(client):
    response = client.post("/v1/queries", json={"question": ""}, headers=AUTH)
    assert response.status_code == 422
    assert "question" in response.json()["message"]
    response = client.post("/v1/rounds", json={"k": 1}, headers=AUTH)
    assert response.status_code == 422 and "k" in response.json()["message"]
    response = client.post("/v1/rounds", json={"bogus": 1}, headers=AUTH)
    assert response.status_code == 422 and "bogus" in response.json()["message"]
    response = client.post("/v1/rounds", json={"kk": 4}, headers=AUTH)  # a typo: the hint
    assert response.status_code == 422
    assert response.json()["message"] == "body: unknown key 'kk' (did you mean 'k'?)"


def test_unknown_round_is_404(client):
    response = client.get("/v1/rounds/nope")
    assert response.status_code == 404 and "does not exist" in response.json()["detail"]
    assert client.post("/v1/rounds/nope/cancel", headers=AUTH).status_code == 404


def test_query_returns_answer_and_full_trace(client):
    response = client.post("/v1/queries", json={"question": "What is the population of Velmora?"},
                           headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    delegations = [e for e in body["trace"] if e.get("delegate")]
    assert delegations and delegations[0]["delegate"] == "searcher"
    searcher = [e for e in body["trace"] if e.get("agent") == "searcher" and "steps" in e]
    assert searcher[0]["steps"][0]["tool"] == "search"
    assert body["format_ok"] is True and body["answer"]
    # every agent's raw model output is in the trace (issue 11.10)
    assert delegations[0]["raw"].startswith("<call>searcher|")
    assert searcher[0]["raw"].startswith("<return>") and searcher[0]["steps"][0]["raw"]


def test_query_trace_shows_a_malformed_answer_raw(client):
    """Before, a planner turn that parsed as nothing left an empty trace."""
    response = client.post("/v1/queries", json={"question": "garble this"}, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["format_ok"] is False and body["answer"] is None
    assert body["trace"] == [{"agent": "planner", "raw": "the answer is probably 42",
                              "error": "not a valid planner turn (<call>agent|task</call> "
                                       "or <answer>...</answer>)"}]


def test_start_list_cancel_round(client):
    response = client.post("/v1/rounds", json={"run_id": "api-run", "queries_per_round": 2},
                           headers=AUTH)
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["rollouts"] == {"total": 4, "completed": 0}
    assert created["trained_models"] == ["planner", "searcher", "coder"]
    again = client.post("/v1/rounds", json={"run_id": "api-run"}, headers=AUTH)
    assert again.status_code == 409 and "still in progress" in again.json()["detail"]
    listed = client.get("/v1/rounds", params={"run_id": "api-run"}).json()
    assert [r["round_id"] for r in listed] == [created["round_id"]]
    cancelled = client.post(f"/v1/rounds/{created['round_id']}/cancel", headers=AUTH).json()
    assert cancelled["status"] == "cancelled"


def test_registry_health_and_metrics(client):
    agents = client.get("/v1/agents").json()
    assert {a["name"]: a["tool"] for a in agents} == {"searcher": "search", "coder": "python"}
    assert client.get("/v1/checkpoints").json() == []
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.json()["checks"]["store"] == "ok"
    metrics = client.get("/metrics").text
    assert 'mgrpo_api_requests_total{route="/v1/agents",status="200"}' in metrics


def test_committed_openapi_matches_the_app(client):
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert committed == client.app.openapi(), \
        "docs/openapi.json is stale: regenerate it (see docs/api.md)"


def test_readyz_in_embedded_mode_says_there_are_no_workers(client, monkeypatch):
    """Before, `mgrpo serve planner` in the default embedded mode answered every delegation
    with `unknown agent` and left rounds running, with nothing said at start or on /readyz."""
    state = client.app.state.api
    ready = client.get("/readyz").json()
    assert ready["checks"]["mode"] == "ok" and "warnings" not in ready  # distributed, served
    # a sub-agent no worker registered for is named
    monkeypatch.setattr(state, "cfg", state.cfg.model_copy(
        update={"agents": {**state.cfg.agents, "writer": "planner"}}))
    (warning,) = client.get("/readyz").json()["warnings"]
    assert warning.startswith("no live worker for sub-agent writer (none registered, or no "
                              "heartbeat within 30 s)")
    from mgrpo.bus import InMemoryBus

    monkeypatch.setattr(state, "cfg", state.cfg.model_copy(update={"agents": {
        r: m for r, m in state.cfg.agents.items() if r != "writer"}}))
    monkeypatch.setattr(state, "settings", state.settings.model_copy(update={"mode":
                                                                             "embedded"}))
    bus = InMemoryBus()
    monkeypatch.setattr(state, "bus", bus)
    embedded = client.get("/readyz")
    assert embedded.status_code == 503
    mode = embedded.json()["checks"]["mode"]
    assert mode.startswith("MGRPO_MODE=embedded: no worker in this process serves this "
                           "planner API's sub-agents")
    assert "unknown agent" in mode and "MGRPO_MODE=distributed" in mode
    # a round nothing would play is refused, not left running forever
    before = len(client.get("/v1/rounds").json())
    refused = client.post("/v1/rounds", json={"run_id": "nobody-plays"}, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["detail"] == mode
    assert len(client.get("/v1/rounds").json()) == before
    # in-process workers (mgrpo ui, tests) serve an embedded API: ready
    try:
        for role in ("searcher", "coder"):
            bus.consume(state.queues.subagent(role), lambda message: None)
        assert client.get("/readyz").json()["checks"]["mode"] == "ok"
    finally:
        bus.close()
