"""schemathesis over the planner's REST API (issue 16 item 6): 0 server errors, and every
status code and content type it returns is documented in the OpenAPI document.

The API runs on a real uvicorn (a thread of this test) against a fresh PostgreSQL database
(the real store: it is PostgreSQL that rejected NUL bytes with a 500) and in-process sub-agent
workers on the in-memory bus, with the scripted policy. schemathesis runs as a subprocess
from its own venv (``.venv-fuzz``, made by ``make tools``: its pins clash with ours), twice:
with the bearer token (mutating endpoints reached) and without (every one refused). Bounded:
a fixed seed and a few examples per operation, about a minute on the 2-core machine; the
coverage phase sends every declared bound and one past it (the test checks it reached the
store's 32-bit checkpoint version).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from serving import running_server

from mgrpo.bus import InMemoryBus
from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.context import load_service_config
from mgrpo.services.subagent.worker import SubagentWorker
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database

ROOT = Path(__file__).resolve().parents[3]
SCHEMATHESIS = ROOT / ".venv-fuzz" / "bin" / "schemathesis"
TOKEN = "fuzz-token"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")


def _schemathesis() -> Path:
    if SCHEMATHESIS.exists():
        return SCHEMATHESIS
    message = f"{SCHEMATHESIS} is missing: run 'make tools' (it makes .venv-fuzz)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def api_url(postgres_url, assets, tmp_path_factory):
    from services_testkit import write_run_config

    tiny, bench = assets
    root = tmp_path_factory.mktemp("fuzz")
    cfg_path = write_run_config(root / "run.yaml", tiny, bench, name="fuzz", k=2, queries=2)
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, run_config=str(cfg_path),
                            api_token=TOKEN, engine="services_testkit:scripted_engine",
                            checkpoint_uri=str(root / "ckpt"))
        cfg = load_service_config(settings)
        bus = InMemoryBus(store)
        for name, tool in (("searcher", "search"), ("coder", "python")):
            SubagentWorker(settings, cfg, store, bus, name, tool).start()
        try:
            with running_server(create_app(ApiState(settings, cfg, store, bus))) as api:
                yield api
        finally:
            store.close()


@pytest.mark.parametrize("with_token", [True, False], ids=["token", "no-token"])
def test_schemathesis_finds_no_server_error_and_no_undocumented_status(api_url, tmp_path,
                                                                       with_token):
    report = tmp_path / "report.ndjson"
    argv = [str(_schemathesis()), "run", f"{api_url}/openapi.json", "--checks", CHECKS,
            "--max-examples", "12", "--seed", "16", "--workers", "1",
            "--phases", "examples,coverage,fuzzing", "--generation-database", "none",
            "--request-timeout", "60", "--no-color", "--report", "ndjson",
            "--report-ndjson-path", str(report)]
    if with_token:
        argv += ["--header", f"Authorization: Bearer {TOKEN}"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                         env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    events = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    assert events, "schemathesis wrote no report"
    # the coverage phase sends each declared bound and one past it: the store's 32-bit
    # checkpoint version (init_from.version, a 500 before it had a maximum) among them
    versions = [body["init_from"].get("version")
                for body in _bodies(events, "POST /v1/rounds") if isinstance(body, dict)
                and isinstance(body.get("init_from"), dict)]
    versions = {v for v in versions if isinstance(v, int)}
    assert {2**31 - 1, 2**31} <= versions, sorted(versions)


def _bodies(events: list[dict], label: str) -> list:
    """The request bodies schemathesis generated for one operation (its ndjson report)."""
    out = []
    for event in events:
        recorder = event.get("ScenarioFinished", {}).get("recorder", {})
        if recorder.get("label") == label:
            out += [case["value"].get("body") for case in recorder.get("cases", {}).values()]
    return out
