"""Runs that cannot hurt each other (issue 11 item 2, issue 16 item 4), through the
distributed round's code path in one process (in-memory bus, SQLite store, scripted
policies, real tiny models in the trainers).

Before: a round of run ``other`` after run ``eco`` sampled from eco's weights, trained from
them, rewrote eco's ``planner/v000001`` and left the store's sha256 of it stale."""

from __future__ import annotations

import hashlib
from pathlib import Path

import fsspec
import pytest
from fastapi.testclient import TestClient
from services_testkit import (
    ScriptedPolicy,
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    wait_done,
    write_run_config,
)

from mgrpo.models.checkpoint import MANIFEST
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round
from mgrpo.training.config import InitFrom

MODELS = ("planner", "searcher", "coder")
TOKEN = "s3cret"


class RecordingPolicy(ScriptedPolicy):
    """The scripted policy, remembering every weights source it was given."""

    loads: list = []

    def load_weights(self, source, version: int) -> None:
        RecordingPolicy.loads.append((source if isinstance(source, str) else "<state>",
                                      version))
        super().load_weights(source, version)


def recording_engine(path: str, device: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, RecordingPolicy(tokenizer)


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    tiny = make_tiny(root / "tiny")
    cfg_path = write_run_config(root / "run.yaml", tiny, make_bench(root / "bench"),
                                name="eco", k=2, queries=2)
    settings = embedded_settings(root, cfg_path, api_token=TOKEN,
                                 engine="test_services_run_isolation:recording_engine")
    with in_process_services(settings, trainers=MODELS) as svc:
        yield settings, svc.cfg, svc.store, svc.bus, tiny


def play(system, run_id: str, **update) -> str:
    settings, cfg, store, bus, _ = system
    record = start_round(store, bus, cfg.model_copy(update=update), Queues(), run_id=run_id)
    assert wait_done(store, record.round_id) == "done"
    return record.round_id


def folder_bytes(uri: str) -> dict[str, bytes]:
    fs, path = fsspec.core.url_to_fs(uri)
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.ls(path, detail=False)}


def weights_versions(store, round_id: str) -> set[int]:
    return {t.weights_version for m in MODELS for t in store.round_trajectories(round_id, m)}


def manifest(uri: str) -> dict:
    import json

    return json.loads(Path(uri, MANIFEST).read_text())


def test_second_run_neither_reads_nor_rewrites_the_first_runs_weights(system):
    settings, cfg, store, bus, tiny = system
    play(system, "eco")
    eco = {c.model: c for c in store.list_checkpoints(run_id="eco")}
    assert set(eco) == set(MODELS) and {c.version for c in eco.values()} == {1}
    eco_files = {m: folder_bytes(c.uri) for m, c in eco.items()}

    RecordingPolicy.loads.clear()
    other_round = play(system, "other")
    # The workers sampled run other's round 0 from the models' folders (v0), not eco's v1.
    assert weights_versions(store, other_round) == {0}
    assert not [s for s, _ in RecordingPolicy.loads if "/eco/" in s]
    # eco's version folders are byte for byte what they were; other has its own v1.
    assert {m: folder_bytes(c.uri) for m, c in eco.items()} == eco_files
    other = {c.model: c for c in store.list_checkpoints(run_id="other")}
    assert {c.version for c in other.values()} == {1}
    for model in MODELS:
        assert "/other/" in other[model].uri and "/eco/" in eco[model].uri
        # The trainer started run other from the model's folder, not from eco's weights.
        assert manifest(other[model].uri)["extra"]["parent"] == str(tiny)
        assert manifest(eco[model].uri)["extra"]["parent"] == str(tiny)
    # The store's sha256 is the file's, for every checkpoint of both runs.
    for record in store.list_checkpoints():
        digest = hashlib.sha256(Path(record.uri, MANIFEST).read_bytes()).hexdigest()
        assert digest == record.sha256, record


def test_each_run_samples_from_its_own_latest_version(system):
    settings, cfg, store, bus, _ = system
    RecordingPolicy.loads.clear()
    eco_round = play(system, "eco")  # eco's round 1 after other's round 0
    assert weights_versions(store, eco_round) == {1}
    loaded = [s for s, v in RecordingPolicy.loads if v > 0]
    assert loaded and all("/eco/" in s for s in loaded)
    assert [c.version for c in store.list_checkpoints("planner", run_id="eco")] == [1, 2]
    assert [c.version for c in store.list_checkpoints("planner", run_id="other")] == [1]
    parent = manifest(store.latest_checkpoint("planner", run_id="eco").uri)["extra"]["parent"]
    assert parent == store.list_checkpoints("planner", run_id="eco")[0].uri


def test_init_from_starts_a_run_from_another_runs_checkpoint(system):
    settings, cfg, store, bus, _ = system
    source = {c.model: c.uri for c in store.list_checkpoints(run_id="eco") if c.version == 2}
    RecordingPolicy.loads.clear()
    fork = play(system, "fork", init_from=InitFrom(run_id="eco", version=2))
    assert weights_versions(store, fork) == {0}  # fork's own v0 is eco's v2
    assert {s for s, v in RecordingPolicy.loads} >= {source["planner"]}
    for record in store.list_checkpoints(run_id="fork"):
        assert manifest(record.uri)["extra"]["parent"] == source[record.model]


def test_round_api_lists_published_models_and_checks_init_from(system):
    settings, cfg, store, bus, _ = system
    client = TestClient(create_app(ApiState(settings, cfg, store, bus)))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    listed = client.get("/v1/rounds", params={"run_id": "eco"}).json()
    assert [(r["status"], r["published_models"]) for r in listed] == [
        ("done", sorted(MODELS)), ("done", sorted(MODELS))]
    refused = client.post("/v1/rounds", headers=auth,
                          json={"run_id": "eco", "init_from": {"run_id": "other"}})
    assert refused.status_code == 422 and "has checkpoints already" in refused.json()["message"]
    missing = client.post("/v1/rounds", headers=auth,
                          json={"run_id": "new", "init_from": {"run_id": "eco", "version": 9}})
    assert missing.status_code == 422 and "has no v9 of planner" in missing.json()["message"]
    local = client.post("/v1/rounds", headers=auth,
                        json={"run_id": "new", "init_from": {"run_id": "eco", "out_dir": "x"}})
    assert local.status_code == 422 and "drop out_dir" in local.json()["message"]
    checkpoints = client.get("/v1/checkpoints", params={"run_id": "other"}).json()
    assert sorted((c["model"], c["version"], c["run_id"]) for c in checkpoints) == [
        (m, 1, "other") for m in sorted(MODELS)]
