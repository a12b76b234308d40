"""The REST API with TestClient: auth, bad input, 404/409, rounds, registry, health, metrics,
a query answered through the planner and in-process sub-agent workers, and the committed
OpenAPI document matching the app."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from services_testkit import in_memory_backend, make_bench, make_tiny, write_run_config

from mgrpo.bus import InMemoryBus
from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.context import load_service_config, open_store

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


def test_an_override_the_run_config_refuses_gets_422(client, monkeypatch):
    """The overrides are validated with the whole run config (not ``model_copy``): a value
    the request schema let through but ``RunConfig`` refuses is a 422, and no round starts.
    (Today's request schema bounds k as tightly as RunConfig; a looser one is simulated.)"""
    from mgrpo.services.api.routes import rounds
    from mgrpo.training.overrides import overridden

    monkeypatch.setattr(rounds, "overridden", lambda cfg, o: overridden(cfg, {**o, "k": 1}))
    before = len(client.get("/v1/rounds").json())
    response = client.post("/v1/rounds", json={"run_id": "refused-k", "k": 3}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["message"].startswith("body.k: "), response.json()
    assert len(client.get("/v1/rounds").json()) == before


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


def hold_trainer_leases(store, models=("planner", "searcher", "coder")) -> None:
    """As running trainers do: each model's lease ``trainer:<model>``, held for 10 min."""
    for model in models:
        assert store.acquire_lease(f"trainer:{model}", f"test-trainer-{model}", 600)


def test_a_round_no_live_worker_would_play_is_refused(tmp_path):
    """Distributed, with no sub-agent worker and no trainer: 409 naming each missing role
    (before, the round was created and stayed running forever); no round is created. Once
    the sub-agents heartbeat and the trainers hold their leases: 201."""
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), k=2, queries=2)
    settings = Settings(mode="distributed", database_url=f"sqlite:///{tmp_path}/store.db",
                        run_config=str(cfg_path), api_token=TOKEN)
    cfg = load_service_config(settings)
    store = open_store(settings)
    with TestClient(create_app(ApiState(settings, cfg, store, InMemoryBus(store)))) as http:
        refused = http.post("/v1/rounds", json={"run_id": "idle"}, headers=AUTH)
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert detail.startswith("no live worker for 5 role(s) this round needs"), detail
        for role in ("searcher", "coder"):
            assert f"sub-agent {role} (no heartbeat within 30 s: start `mgrpo serve " \
                   f"subagent --name {role}`)" in detail
        for model in ("planner", "searcher", "coder"):
            assert f"trainer of {model} (nobody holds lease trainer:{model}" in detail
        assert "\n" not in detail
        assert http.get("/v1/rounds").json() == []
        bad = http.post("/v1/rounds", json={"run_id": "other", "init_from": {
            "run_id": "other"}}, headers=AUTH)
        assert bad.status_code == 422  # bad input is answered as such, workers or not
        for role in ("searcher", "coder"):
            store.register_agent(role, role, f"subagent.{role}")
        hold_trainer_leases(store, ("planner", "searcher"))
        refused = http.post("/v1/rounds", json={"run_id": "idle"}, headers=AUTH)
        assert refused.status_code == 409
        assert refused.json()["detail"].startswith("no live worker for 1 role(s)")
        assert "trainer of coder" in refused.json()["detail"]
        store.acquire_lease("trainer:coder", "a-dead-trainer", 0.001)  # expired at once
        time.sleep(0.01)
        assert http.post("/v1/rounds", json={"run_id": "idle"},
                         headers=AUTH).status_code == 409
        hold_trainer_leases(store, ("coder",))
        started = http.post("/v1/rounds", json={"run_id": "idle"}, headers=AUTH)
        assert started.status_code == 201, started.text
    store.close()


def test_start_list_cancel_round(client):
    hold_trainer_leases(client.app.state.api.store)
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
