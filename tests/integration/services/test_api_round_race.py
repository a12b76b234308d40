"""Concurrent ``POST /v1/rounds`` of one run, on the real PostgreSQL and RabbitMQ: exactly one
201, every other 409, and the round's tasks published once (B*K episode tasks and one
``RoundCommand`` per model on the queues, nothing more). Before, the busy check and the
create were not tied: 15 of 20 concurrent starts answered 201 for the same round, and each
published every task again.

A start that decided on a stale read (the round it would create exists, and is finished by
now) gets 409 and leaves that round's status alone (before, it set it back to ``running``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fresh_run import fresh_run
from kombu import Connection
from queues_cleanup import MODELS
from serving import running_server

from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.context import make_bus
from mgrpo.services.rounds import RoundConflict, start_round

TOKEN = "race-token"
STARTS = 20


@pytest.fixture
def api(postgres_url, rabbitmq_url, tmp_path):
    """(url, store, queues, broker url): the planner API on a fresh database and prefix."""
    with fresh_run(postgres_url, rabbitmq_url, tmp_path, "race", api_token=TOKEN,
                   round_needs_workers=False) as run:  # no workers: the tasks stay queued
        bus = make_bus(run.settings, run.store)
        try:
            with running_server(create_app(ApiState(run.settings, run.cfg, run.store,
                                                    bus))) as base:
                yield base, run.store, run.cfg, bus, run.queues, rabbitmq_url
        finally:
            bus.close()


def _depths(broker_url: str, names: list[str]) -> dict[str, int]:
    with Connection(broker_url) as connection:
        channel = connection.channel()
        return {name: channel.queue_declare(name, passive=True).message_count
                for name in names}


def test_concurrent_starts_create_one_round_and_publish_once(api):
    base, store, _, _, queues, broker = api
    barrier = threading.Barrier(STARTS)

    def post(_: int) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=120) as http:
            barrier.wait()
            return http.post("/v1/rounds", json={"run_id": "race"},
                             headers={"Authorization": f"Bearer {TOKEN}"})

    with ThreadPoolExecutor(STARTS) as pool:
        responses = list(pool.map(post, range(STARTS)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] + [409] * (STARTS - 1), [(r.status_code, r.text[:200])
                                                  for r in responses]
    created = next(r.json() for r in responses if r.status_code == 201)
    assert created["round_id"] == "race-r0000" and created["status"] == "running"
    assert all("race-r0000" in r.json()["detail"] for r in responses if r.status_code == 409)
    assert [r.round_id for r in store.list_rounds("race")] == ["race-r0000"]
    depths = _depths(broker, [queues.episodes, *(queues.trainer(m) for m in MODELS)])
    assert depths == {queues.episodes: 3 * 2, **{queues.trainer(m): 1 for m in MODELS}}


def test_a_late_start_never_sets_a_finished_round_back_to_running(api):
    _, store, cfg, bus, queues, broker = api
    record = start_round(store, bus, cfg, queues, run_id="race")
    store.set_round_status(record.round_id, "cancelled")
    # a start that read the run before the round existed decides on the same index
    with pytest.raises(RoundConflict, match="exists already"):
        start_round(store, bus, cfg, queues, run_id="race", index=record.index)
    assert store.get_round(record.round_id).status == "cancelled"
    depths = _depths(broker, [queues.episodes])
    assert depths == {queues.episodes: 3 * 2}  # the first start's tasks only


def test_init_from_version_beyond_the_store_integer_is_422_not_500(api):
    """The version column is a 32-bit integer: 2^31 is refused by the schema (before: a 500,
    ``NumericValueOutOfRange``, and the next request on the connection was reset); 2^31 - 1
    reaches the store and is a 422 naming the missing version. The connection keeps
    serving."""
    base = api[0]
    with httpx.Client(base_url=base, timeout=60,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for version, says in ((2**31, "less than or equal to 2147483647"),
                              (2**31 - 1, "has no v2147483647")):
            response = http.post("/v1/rounds", json={
                "run_id": "fresh", "init_from": {"run_id": "race", "version": version}})
            assert response.status_code == 422, response.text
            assert says in response.text, response.text
        assert http.get("/v1/rounds").status_code == 200


def _gauge(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


def test_stalled_round_metric_counts_seconds_without_progress(api):
    """``mgrpo_round_stalled_seconds``: no worker plays the round here, so it grows from its
    start (the store's clock); 0 once no round is unfinished."""
    base, store, cfg, bus, queues, _ = api
    assert _gauge(base, "mgrpo_round_stalled_seconds") == 0.0
    record = start_round(store, bus, cfg, queues, run_id="race")
    time.sleep(1.5)
    stalled = _gauge(base, "mgrpo_round_stalled_seconds")
    assert 1.4 <= stalled < 60, stalled
    store.set_round_status(record.round_id, "cancelled")
    assert _gauge(base, "mgrpo_round_stalled_seconds") == 0.0
