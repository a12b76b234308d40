"""Evaluation jobs outlive the API process that ran them (``evaluation_jobs`` in the store):
two app instances on one SQLite store stand for two replicas, or for a process and the one
that replaced it. Before, jobs lived in the process: the second instance answered 404.

The planner is the scripted policy with a gate (``gated_engine``): closed, its turns wait,
so an evaluation stays running while we look at it from the other instance."""

from __future__ import annotations

import contextlib

import pytest
import services_testkit as kit
from fastapi.testclient import TestClient
from services_testkit import in_memory_backend, make_bench, make_tiny, write_run_config
from waiting import wait_for

from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.api.evaluation_jobs import LEASE, EvaluationJobs
from mgrpo.services.context import open_store

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaljobs")
    return root, write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                  make_bench(root / "bench"), k=2, queries=2)


@pytest.fixture
def setup(files, tmp_path):
    """A store and a bus with sub-agent workers of their own: an app instance closes its
    bus when it stops."""
    _, cfg_path = files
    settings = Settings(mode="distributed", database_url=f"sqlite:///{tmp_path}/store.db",
                        run_config=str(cfg_path), api_token=TOKEN,
                        engine="services_testkit:gated_engine")
    cfg, store, bus = in_memory_backend(settings)
    return settings, cfg, store, bus


def instance(setup, plays: bool = False, settings=None, **jobs) -> tuple[ApiState, TestClient]:
    """One API process: its own store connection and its own owner id; the bus (to the
    sub-agents) only for the one that ``plays`` evaluations."""
    default_settings, cfg, store, bus = setup
    settings = settings or default_settings
    own_store = open_store(settings)
    state = ApiState(settings, cfg, own_store, bus if plays else None,
                     evaluations=EvaluationJobs(own_store, **jobs))
    return state, TestClient(create_app(state))


def test_a_finished_job_is_read_by_another_instance(setup):
    _, first = instance(setup, plays=True)
    _, second = instance(setup)
    with first, second:
        started = first.post("/v1/evaluations", json={"n_questions": 3}, headers=AUTH)
        assert started.status_code == 202, started.text
        location = started.headers["Location"]
        assert wait_for(lambda: first.get(location).json()["status"] != "running")
        done = first.get(location).json()
        assert done["status"] == "done" and done["played"] == 3 and done["result"]["n"] == 3
        assert second.get(location).json() == done  # the other replica: not 404
        assert done in second.get("/v1/evaluations").json()
    # a third instance, started after both stopped (a restart), still answers for it
    _, third = instance(setup)
    with third:
        assert third.get(location).json() == done
    assert setup[2].get_lease(LEASE) is None  # released when the job ended


@contextlib.contextmanager
def third_question_held(setup, **jobs):
    """(state, client) of an instance that plays one episode per batch, the third test
    question's planner turns waiting until ``kit.PLANNER_GATE`` is set (set again on exit)."""
    settings = setup[0].model_copy(update={"query_batch_size": 1})
    state, client = instance(setup, plays=True, settings=settings, **jobs)
    kit.PLANNER_HOLD[:] = [state.benchmark().questions("test")[2].question]
    kit.PLANNER_GATE.clear()
    try:
        yield state, client
    finally:
        kit.PLANNER_HOLD.clear()
        kit.PLANNER_GATE.set()


def test_progress_is_written_while_it_runs(setup):
    """Episodes one per batch; the third question's planner turns wait: the other instance
    reads played == 2 from the store while the job runs (written every progress_s)."""
    store = setup[2]
    with third_question_held(setup, progress_s=0.05) as (_, first):
        _, second = instance(setup)
        with first, second:
            started = first.post("/v1/evaluations", json={"n_questions": 4}, headers=AUTH)
            assert started.status_code == 202, started.text
            evaluation_id = started.json()["evaluation_id"]
            assert wait_for(lambda: store.get_evaluation(evaluation_id).played == 2)
            job = second.get(started.headers["Location"]).json()
            assert (job["status"], job["played"], job["n_questions"]) == ("running", 2, 4)
            kit.PLANNER_GATE.set()
            assert wait_for(lambda: store.get_evaluation(evaluation_id).status == "done")
            assert second.get(started.headers["Location"]).json()["played"] == 4


def test_a_job_of_a_dead_process_reads_interrupted_not_404(setup):
    store = setup[2]
    kit.PLANNER_GATE.clear()  # the first instance's evaluation plays no turn: stays running
    try:
        # lease_s long: the first instance does not renew during the test
        first_state, first = instance(setup, plays=True, lease_s=300,
                                     progress_s=0.05)
        with first:
            started = first.post("/v1/evaluations", json={"n_questions": 4}, headers=AUTH)
            assert started.status_code == 202, started.text
            location = started.headers["Location"]
            evaluation_id = started.json()["evaluation_id"]
            assert wait_for(lambda: kit.PLANNER_BATCHES and store.get_evaluation(
                evaluation_id).status == "running")
            owner = first_state.evaluations.owner
            assert store.get_lease(LEASE).holder == owner

            _, second = instance(setup)
            with second:  # a live owner: the other replica says running, and is busy
                job = second.get(location).json()
                assert (job["status"], job["played"]) == ("running", 0), job
                busy = second.post("/v1/evaluations", json={"n_questions": 2}, headers=AUTH)
                assert busy.status_code == 429, busy.text
                assert evaluation_id in busy.json()["detail"]
                assert int(busy.headers["Retry-After"]) >= 1

            # the first process dies: its lease is gone (expired, or here released)
            assert store.release_lease(LEASE, owner)
            _, restarted = instance(setup)
            with restarted:  # its start-up sweep marks the job
                assert store.get_evaluation(evaluation_id).status == "interrupted"
                job = restarted.get(location).json()
                assert job["status"] == "interrupted", job
                assert job["error"].startswith("interrupted: the API process that ran it")
                assert job["finished_at"] is not None
                # the first (taken for dead) finishes its episodes but never overwrites
                kit.PLANNER_GATE.set()
                assert wait_for(lambda: first_state.evaluations.running() is None)
                assert first.get(location).json()["status"] == "interrupted"
                assert store.get_evaluation(evaluation_id).played == 0
                again = restarted.post("/v1/evaluations", json={"n_questions": 1},
                                       headers=AUTH)
                assert again.status_code == 202, again.text  # the lease is free again
    finally:
        kit.PLANNER_GATE.set()


def test_a_clean_shutdown_marks_its_running_job_interrupted(setup):
    store = setup[2]
    kit.PLANNER_GATE.clear()
    try:
        _, client = instance(setup, plays=True)
        with client:
            started = client.post("/v1/evaluations", json={"n_questions": 2}, headers=AUTH)
            assert started.status_code == 202, started.text
            evaluation_id = started.json()["evaluation_id"]
        job = store.get_evaluation(evaluation_id)
        assert (job.status, job.error) == ("interrupted", "interrupted: the API process "
                                           "that ran it shut down; start it again")
        assert store.get_lease(LEASE) is None  # released: the next start need not wait
    finally:
        kit.PLANNER_GATE.set()


def test_progress_read_is_the_stored_one_so_a_kill_never_turns_it_back(setup):
    """The process running a job answers with the ``played`` the store holds, not a count in
    its memory the store has not seen: otherwise a reader saw 2, the process was killed, and
    every replica then said 0 (the store's last write)."""
    store = setup[2]
    # progress_s: never written while it runs
    with third_question_held(setup, progress_s=3600.0) as (first_state, first), first:
        started = first.post("/v1/evaluations", json={"n_questions": 4}, headers=AUTH)
        assert started.status_code == 202, started.text
        evaluation_id = started.json()["evaluation_id"]
        job = first_state.evaluations._jobs[evaluation_id]
        assert wait_for(lambda: job.played == 2)  # in memory, not yet in the store
        stored = store.get_evaluation(evaluation_id).played
        assert first.get(started.headers["Location"]).json()["played"] == stored == 0
        kit.PLANNER_GATE.set()
        assert wait_for(lambda: store.get_evaluation(evaluation_id).status == "done")
        assert first.get(started.headers["Location"]).json()["played"] == 4
