"""Evaluations as Celery tasks (``MGRPO_EVALUATION_QUEUE``) through the real RabbitMQ and a
fresh PostgreSQL database: ``POST /v1/evaluations`` records the job queued and sends
``mgrpo.control.evaluate`` with its typed payload; the evaluation worker in the API's process
plays it to ``done`` with the accuracy the in-process path gives; a poison payload is
dead-lettered with its reason; a redelivered task plays nothing twice.

The planner is the scripted policy (``gated_engine``); its sub-agents run on an in-memory
bus in this process; the Celery queues are the broker's, under a prefix of their own."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path

import pytest
import services_testkit as kit
from celery.signals import task_retry
from fastapi.testclient import TestClient
from kombu import Connection
from services_testkit import make_bench, make_tiny, write_run_config
from waiting import wait_for

from mgrpo.bus import InMemoryBus
from mgrpo.bus.app import control_app, send_control
from mgrpo.bus.control import TASK_EVALUATE, TASK_PRUNE_CHECKPOINTS, Evaluate, PruneCheckpoints
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.names import DEAD_LETTER_QUEUE
from mgrpo.bus.topology import work_queue
from mgrpo.config import Settings
from mgrpo.models.checkpoint import MANIFEST, list_versions, run_root, version_uri
from mgrpo.services.api import evaluation_worker
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.api.evaluation_jobs import LEASE, STALE_REASON, EvaluationJobs
from mgrpo.services.context import load_service_config, open_store
from mgrpo.services.control.tasks import Backoff
from mgrpo.services.subagent.worker import SubagentWorker
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database

TOKEN = "evalq-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalq")
    return write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                            make_bench(root / "bench"), k=2, queries=2)


@pytest.fixture
def setup(postgres_url, rabbitmq_url, files):
    """(settings with the queue on, what stops the APIs' sub-agents and stores, a store, a
    reader of the dead-letter queue); a fresh database and queue prefix per test."""
    prefix = f"evalq{uuid.uuid4().hex[:10]}."
    with temporary_database(postgres_url) as url:
        Store(url).upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            queue_prefix=prefix, run_config=str(files), api_token=TOKEN,
                            engine="services_testkit:gated_engine", evaluation_queue=True)
        store = Store(url)
        reader = KombuBus(rabbitmq_url, dead_letter_queue_name=prefix + DEAD_LETTER_QUEUE)
        stops: list = []
        try:
            yield settings, stops, store, reader
        finally:
            for stop in stops:
                stop()
            reader.close()
            store.close()
            with Connection(rabbitmq_url) as connection:
                for name in ("mgrpo.evaluations", "mgrpo.control", DEAD_LETTER_QUEUE):
                    with contextlib.suppress(Exception):  # never declared
                        connection.channel().queue_delete(prefix + name)


def api(setup, jobs: dict | None = None, **update) -> tuple[ApiState, TestClient]:
    """One API process: its own in-memory bus to sub-agents of its own (an app closes its
    bus when it stops) and its own store connection."""
    settings, stops = setup[0].model_copy(update=update), setup[1]
    cfg, store = load_service_config(settings), open_store(settings)
    bus = InMemoryBus(store)
    for name, tool in (("searcher", "search"), ("coder", "python")):
        worker = SubagentWorker(settings, cfg, store, bus, name, tool)
        worker.start()
        stops.append(worker.stop)
    stops.append(store.close)
    state = ApiState(settings, cfg, store, bus, evaluations=EvaluationJobs(store, **jobs or {}))
    return state, TestClient(create_app(state))


def finished(client: TestClient, location: str) -> dict:
    assert wait_for(lambda: client.get(location).json()["status"] not in ("queued",
                                                                          "running"),
                    timeout_s=TIMEOUT_S), client.get(location).json()
    return client.get(location).json()


def letters(reader: KombuBus, n: int) -> list:
    got: list = []
    assert wait_for(lambda: got.extend(reader.dead_letters()) or len(got) >= n,
                    timeout_s=TIMEOUT_S), got
    return got


def test_the_task_is_sent_with_its_name_and_payload(setup):
    """No worker started (the app's start-up hooks do not run): the message waits in
    <prefix>mgrpo.evaluations; a second POST is refused while it is queued."""
    settings, store = setup[0], setup[2]
    _, client = api(setup)
    started = client.post("/v1/evaluations", json={"n_questions": 3, "greedy": False},
                          headers=AUTH)
    assert started.status_code == 202, started.text
    job = started.json()
    assert (job["status"], job["played"], job["n_questions"]) == ("queued", 0, 3)
    busy = client.post("/v1/evaluations", json={"n_questions": 1}, headers=AUTH)
    assert busy.status_code == 429 and job["evaluation_id"] in busy.json()["detail"]
    assert int(busy.headers["Retry-After"]) >= 1
    with Connection(settings.broker_url) as connection:
        message = connection.default_channel.basic_get(
            settings.queue_prefix + "mgrpo.evaluations", no_ack=True)
    assert message is not None
    assert message.headers["task"] == TASK_EVALUATE == "mgrpo.control.evaluate"
    assert message.headers["id"] == job["evaluation_id"]
    args, kwargs, _ = json.loads(message.body)
    assert args == [{"evaluation_id": job["evaluation_id"], "n_questions": 3,
                     "split": "test", "greedy": False}] and kwargs == {}
    assert store.get_evaluation(job["evaluation_id"]).owner == ""
    assert store.get_lease(LEASE) is None  # the POST held it only while it queued the job
    # its task is gone (taken off the queue above): past queued_s the job ends failed, and
    # the next POST is accepted
    _, later = api(setup, jobs={"queued_s": 0.0})
    again = later.post("/v1/evaluations", json={"n_questions": 1}, headers=AUTH)
    assert again.status_code == 202 and again.json()["status"] == "queued", again.text
    lost = later.get(started.headers["Location"]).json()
    assert (lost["status"], lost["error"]) == ("failed", STALE_REASON.format(s=0.0)), lost


def test_a_worker_plays_it_to_done_with_the_in_process_accuracy(setup):
    """The varied policy: an episode's answer is well-formed or not by its turn seeds, so an
    equal result says both paths played the same seeds."""
    store, varied = setup[2], "services_testkit:varied_engine"
    _, local = api(setup, evaluation_queue=False, engine=varied)
    with local:
        started = local.post("/v1/evaluations", json={"n_questions": 6}, headers=AUTH)
        assert started.status_code == 202 and started.json()["status"] == "running"
        in_process = finished(local, started.headers["Location"])
    state, client = api(setup, engine=varied)
    with client:
        started = client.post("/v1/evaluations", json={"n_questions": 6}, headers=AUTH)
        assert started.status_code == 202, started.text
        assert started.json()["status"] == "queued"
        queued = finished(client, started.headers["Location"])
        worker = state.evaluation_worker
        assert worker.ctx.done == {TASK_EVALUATE: 1}
    assert in_process["status"] == queued["status"] == "done", (in_process, queued)
    assert queued["played"] == queued["n_questions"] == 6
    assert queued["result"] == in_process["result"]
    assert queued["result"]["n"] == 6 and 0 < queued["result"]["format_valid"] < 1
    record = store.get_evaluation(queued["evaluation_id"])
    assert record.owner not in ("", state.evaluations.owner)  # the play's own lease holder
    assert store.get_lease(LEASE) is None  # released when it ended


def test_a_query_is_answered_while_the_worker_plays_an_evaluation(setup, monkeypatch):
    """The worker's episodes share the API's model thread with queries (its background
    lane): batches of 2, 16 questions, ~50 ms a model call; the query is answered while the
    evaluation still runs."""
    monkeypatch.setenv("MGRPO_TEST_GENERATE_DELAY_S", "0.05")
    kit.PLANNER_BATCHES.clear()
    _, client = api(setup, query_batch_size=2)
    with client:
        started = client.post("/v1/evaluations", json={"n_questions": 16}, headers=AUTH)
        assert started.status_code == 202 and started.json()["status"] == "queued"
        location = started.headers["Location"]
        assert wait_for(lambda: client.get(location).json()["status"] == "running"
                        and kit.PLANNER_BATCHES, timeout_s=TIMEOUT_S)
        answered = client.post("/v1/queries", json={"question": "What is the population of "
                                                    "Velmora?"}, headers=AUTH)
        during = client.get(location).json()
        assert answered.status_code == 200 and answered.json()["answer"], answered.text
        assert during["status"] == "running" and during["played"] < 16, during
        done = finished(client, location)
    assert done["status"] == "done" and done["played"] == 16, done


def test_a_clean_shutdown_interrupts_the_played_job_and_acks_its_task(setup):
    """The planner's turns wait (gate closed) while the API stops: its job reads
    interrupted, its task is acked (not redelivered), the lease is free."""
    settings, store = setup[0], setup[2]
    kit.PLANNER_GATE.clear()
    kit.PLANNER_BATCHES.clear()
    try:
        state, client = api(setup)
        with client:
            started = client.post("/v1/evaluations", json={"n_questions": 3}, headers=AUTH)
            assert started.status_code == 202, started.text
            evaluation_id = started.json()["evaluation_id"]
            assert wait_for(lambda: store.get_evaluation(evaluation_id).status == "running"
                            and kit.PLANNER_BATCHES, timeout_s=TIMEOUT_S)
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 20  # the worker did not wait for the gate
    finally:
        kit.PLANNER_GATE.set()
    record = store.get_evaluation(evaluation_id)
    assert (record.status, record.played) == ("interrupted", 0)
    assert record.error.startswith("interrupted: the API process that ran it shut down")
    assert store.get_lease(LEASE) is None
    assert state.evaluation_worker.ctx.done == {TASK_EVALUATE: 1}  # acked, ran to its end
    with Connection(settings.broker_url) as connection:
        queue = connection.default_channel.queue_declare(
            settings.queue_prefix + "mgrpo.evaluations", passive=True)
    assert queue.message_count == 0


def test_a_poison_payload_is_dead_lettered_with_its_reason(setup):
    settings, store, reader = setup[0], setup[2], setup[3]
    state, client = api(setup)
    queue = settings.queue_prefix + "mgrpo.evaluations"
    options = {"queue": work_queue(queue, settings.queue_prefix + DEAD_LETTER_QUEUE),
               "routing_key": queue}
    app = state.evaluation_worker.app
    with client:
        app.send_task(TASK_EVALUATE, args=[{"evaluation_id": "not-an-id", "n_questions": 0,
                                            "split": "test", "greedy": True}], **options)
        missing = uuid.uuid4().hex  # a valid payload naming no evaluation
        send_control(app, TASK_EVALUATE, Evaluate(evaluation_id=missing, n_questions=2,
                                                  split="test", greedy=True))
        got = sorted(letters(reader, 2), key=lambda letter: letter.reason)
    invalid, unknown = got
    assert invalid.reason.startswith("invalid mgrpo.control.evaluate payload: ")
    assert "evaluation_id: String should match pattern" in invalid.reason
    assert "n_questions: Input should be greater than or equal to 1" in invalid.reason
    assert unknown.reason == (f"mgrpo.control.evaluate failed: UnknownEvaluation: "
                              f"evaluation {missing!r} does not exist; POST /v1/evaluations "
                              "records it before sending it")
    assert invalid.queue == unknown.queue == queue
    assert json.loads(invalid.body)["task"] == TASK_EVALUATE  # replayable as the same task
    assert state.evaluation_worker.ctx.done == {}
    assert store.list_evaluations() == []


def test_a_dead_lettered_task_ends_its_queued_job_failed(setup, monkeypatch):
    """Another replica holds the lease past the retries: the task is retried with back-off,
    then dead-lettered; the letter and the queued job say why."""
    store, reader = setup[2], setup[3]
    monkeypatch.setattr(evaluation_worker, "BACKOFF",
                        Backoff(first_s=0.1, max_s=0.2, max_retries=2))
    state, client = api(setup)
    retries: list[float] = []

    def on_retry(**_):
        retries.append(time.monotonic())

    task_retry.connect(on_retry, weak=False)
    assert store.acquire_lease(LEASE, "another-replica:1:x", 300)
    try:
        with client:
            busy = client.post("/v1/evaluations", json={"n_questions": 2}, headers=AUTH)
            assert busy.status_code == 429, busy.text
            evaluation_id = uuid.uuid4().hex  # queued by a replica before the lease was taken
            store.create_evaluation(evaluation_id, "", {"n_questions": 2, "split": "test",
                                                        "greedy": True}, 2, "queued")
            state.evaluation_worker.send(Evaluate(evaluation_id=evaluation_id, n_questions=2,
                                                  split="test", greedy=True))
            [letter] = letters(reader, 1)
    finally:
        task_retry.disconnect(on_retry)
        store.release_lease(LEASE, "another-replica:1:x")
    assert len(retries) == 2 and retries[1] - retries[0] >= 0.1
    assert letter.reason.startswith("mgrpo.control.evaluate: transient failure persisted "
                                    "after 2 retries: EvaluationBusy: evaluation ")
    record = store.get_evaluation(evaluation_id)
    assert (record.status, record.error) == ("failed", letter.reason)
    assert record.finished_at is not None


def test_a_redelivered_task_does_not_run_twice(setup):
    store = setup[2]
    state, client = api(setup)
    worker = state.evaluation_worker
    with client:
        started = client.post("/v1/evaluations", json={"n_questions": 2}, headers=AUTH)
        done = finished(client, started.headers["Location"])
        assert done["status"] == "done" and worker.ctx.done == {TASK_EVALUATE: 1}
        evaluation_id = done["evaluation_id"]
        command = Evaluate(evaluation_id=evaluation_id, n_questions=2, split="test",
                           greedy=True)
        played = state.batcher.batch_sizes[:]  # this process's model thread's batches
        worker.send(command)  # the same task id again: a redelivery after a lost ack
        # a new id for the same evaluation: a worker killed before it recorded the id
        send_control(worker.app, TASK_EVALUATE, command)
        assert wait_for(lambda: worker.ctx.done == {TASK_EVALUATE: 2}, timeout_s=TIMEOUT_S)
        time.sleep(0.5)
        assert state.batcher.batch_sizes == played  # nothing played again
        assert client.get(started.headers["Location"]).json() == done

        # the job of a worker killed while it played (running, its owner's lease gone):
        # the redelivery plays nothing; the job reads interrupted
        killed = uuid.uuid4().hex
        store.create_evaluation(killed, "", {"n_questions": 2, "split": "test",
                                             "greedy": True}, 2, "queued")
        assert store.claim_evaluation(killed, "killed-host:1:dead")
        worker.send(Evaluate(evaluation_id=killed, n_questions=2, split="test",
                             greedy=True))
        assert wait_for(lambda: worker.ctx.done == {TASK_EVALUATE: 3}, timeout_s=TIMEOUT_S)
        job = client.get(f"/v1/evaluations/{killed}").json()
        assert job["status"] == "interrupted" and job["played"] == 0, job
        assert state.batcher.batch_sizes == played


def test_the_control_worker_process_runs_its_tasks(deployment, tmp_path):
    """`mgrpo serve control` as its own process: a prune sent to mgrpo.control runs there
    (its pool finds the task in the process's default Celery app)."""
    env, store, services = deployment
    services.start("control", "control")
    services.wait_healthy("control")
    settings = Settings(broker_url=env["MGRPO_BROKER_URL"],
                        queue_prefix=env["MGRPO_QUEUE_PREFIX"])
    root = run_root(env["MGRPO_CHECKPOINT_URI"], "proc-run")
    for version in (1, 2, 3):
        folder = Path(version_uri(root, "coder", version))
        folder.mkdir(parents=True)
        (folder / MANIFEST).write_text("{}")
        store.record_checkpoint("coder", version, str(folder), "0" * 64, run_id="proc-run")
    send_control(control_app(settings), TASK_PRUNE_CHECKPOINTS,
                 PruneCheckpoints(run_id="proc-run", model="coder", keep=1))
    assert wait_for(lambda: list_versions(root, "coder") == [3], timeout_s=TIMEOUT_S), \
        services.log("control")[-3000:]
    assert [c.version for c in store.list_checkpoints("coder", run_id="proc-run")] == [3]
