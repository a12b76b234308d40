"""Store checks run on SQLite (tests/unit/store) AND on PostgreSQL (tests/integration/store):
a plain module, imported by both (conftest files are not importable)."""

from __future__ import annotations

import pytest

from mgrpo.store import Store


def checkpoint_contract(store, model: str) -> None:
    """Issue 16 item 4: a conflicting sha256 (or uri) for a recorded (run, model, version)
    used to be dropped silently (the first kept, the files rewritten); now it raises. The
    same version number in another run is another checkpoint."""
    from mgrpo.store.registry import CheckpointConflict

    assert store.record_checkpoint(model, 1, "file:///ck/eco/v1", "a" * 64, run_id="eco")
    with pytest.raises(CheckpointConflict, match="already recorded"):
        store.record_checkpoint(model, 1, "file:///ck/eco/v1", "b" * 64, run_id="eco")
    with pytest.raises(CheckpointConflict, match="already recorded"):
        store.record_checkpoint(model, 1, "file:///ck/elsewhere", "a" * 64, run_id="eco")
    assert store.record_checkpoint(model, 1, "file:///ck/other/v1", "b" * 64, run_id="other")
    assert store.latest_checkpoint(model, run_id="eco").sha256 == "a" * 64
    assert store.latest_checkpoint(model, run_id="other").sha256 == "b" * 64
    assert store.latest_checkpoint(model, run_id="nobody") is None
    assert [(c.run_id, c.version) for c in store.list_checkpoints(model)] == [
        ("eco", 1), ("other", 1)]
    assert [c.uri for c in store.list_checkpoints(model, run_id="other")] == [
        "file:///ck/other/v1"]


def migration_0002_contract(url: str) -> None:
    """A checkpoint recorded before 0002 (global versions) gets the run of its round."""
    from sqlalchemy import create_engine, text

    from mgrpo.store.migrate import upgrade

    upgrade(url, "0001")
    engine = create_engine(url)
    with engine.begin() as db:
        db.execute(text("INSERT INTO runs (run_id, name, status, config, created_at) "
                        "VALUES ('eco', 'eco', 'done', '{}', CURRENT_TIMESTAMP)"))
        db.execute(text("INSERT INTO rounds (round_id, run_id, index, k, status, config, "
                        "created_at) VALUES ('eco-r0000', 'eco', 0, 2, 'done', '{}', "
                        "CURRENT_TIMESTAMP)".replace(" index,", ' "index",')))
        for version, round_id in ((1, "'eco-r0000'"), (2, "NULL")):
            db.execute(text(f"INSERT INTO checkpoints (model, version, uri, sha256, round_id, "
                            f"created_at) VALUES ('planner', {version}, 'u{version}', "
                            f"'{'a' * 64}', {round_id}, CURRENT_TIMESTAMP)"))
    engine.dispose()
    store = Store(url)
    store.upgrade()
    assert [(c.run_id, c.version) for c in store.list_checkpoints("planner")] == [
        ("", 2), ("eco", 1)]
    assert store.record_checkpoint("planner", 1, "u-other", "b" * 64, run_id="other")
    store.close()


def lease_contract(store, name: str) -> None:
    """Issue 13: one holder at a time; the holder renews; another takes over only after the
    lease expired (a dead holder) or was released."""
    import time

    assert store.get_lease(name) is None
    assert store.acquire_lease(name, "a", ttl_s=30)
    first = store.get_lease(name)
    assert not store.acquire_lease(name, "b", ttl_s=30)  # held, unexpired: refused
    assert store.get_lease(name).holder == "a"
    assert store.acquire_lease(name, "a", ttl_s=30)  # a renewal keeps acquired_at
    renewed = store.get_lease(name)
    assert renewed.acquired_at == first.acquired_at and renewed.expires_at > first.expires_at
    assert not store.release_lease(name, "b")  # not b's to give back
    assert store.release_lease(name, "a")
    assert store.get_lease(name) is None
    assert store.acquire_lease(name, "b", ttl_s=0.3)
    assert not store.acquire_lease(name, "a", ttl_s=30)
    time.sleep(0.6)  # b died: its lease expired
    assert store.acquire_lease(name, "a", ttl_s=30)
    assert store.get_lease(name).holder == "a"
    assert not store.acquire_lease(name, "b", ttl_s=30)
    assert store.acquire_lease(f"{name}-other", "b", ttl_s=30)  # names are independent
    with pytest.raises(ValueError, match="ttl_s"):
        store.acquire_lease(name, "a", ttl_s=0)
    # the holder's problem: only its own row, kept by a renewal, gone for a new holder
    assert store.lease_problem(name) is None
    assert not store.set_lease_problem(name, "b", "not b's lease")
    assert store.set_lease_problem(name, "a", "checkpoint disk: no space left")
    assert store.acquire_lease(name, "a", ttl_s=0.3)  # a renewal keeps it
    assert store.lease_problem(name) == "checkpoint disk: no space left"
    time.sleep(0.6)  # a died: an expired lease reports nothing
    assert store.lease_problem(name) is None
    assert store.acquire_lease(name, "b", ttl_s=30)
    assert store.get_lease(name).problem is None and store.lease_problem(name) is None
    assert store.set_lease_problem(name, "b", None)


def finish_episodes_contract(store, round_id: str) -> None:
    """The planner worker's batch write: outcomes, d_k and completions in one transaction
    of a few statements (multi-row; one UPDATE on PostgreSQL). Each rollout is won by the
    first attempt that completes it, in a batch or alone; a batch replayed writes nothing."""
    from mgrpo.store import DCount, PlannerOutcomeIn

    store.create_run(round_id)
    store.create_round(round_id, round_id, 0, ["q1", "q2"], 2)
    assert store.complete_rollout(round_id, "q2", 0, 7)  # another attempt got there first

    def outcome(query: str, rollout: int, attempt: int) -> PlannerOutcomeIn:
        return PlannerOutcomeIn(query_id=query, rollout=rollout, attempt=attempt,
                                format_ok=True, correct=float(rollout), reward=0.5)

    batch = [outcome("q1", 0, 0), outcome("q2", 0, 0), outcome("q1", 1, 0), outcome("q2", 1, 0)]
    counts = {"searcher": [DCount(query_id=o.query_id, rollout=o.rollout, attempt=0, d=i)
                           for i, o in enumerate(batch)]}
    assert store.finish_episodes(round_id, batch, counts) == [True, False, True, True]
    assert store.finish_episodes(round_id, batch, counts) == [False] * 4
    progress = store.round_progress(round_id)
    assert (progress.total, progress.completed, progress.done) == (4, 4, True)
    # the completing attempts' rows only (q2/0 is attempt 7's, which wrote none)
    assert sorted((o.query_id, o.rollout, o.correct)
                  for o in store.read_planner_outcomes(round_id)) == [
        ("q1", 0, 0.0), ("q1", 1, 1.0), ("q2", 1, 1.0)]
    assert sorted((c.query_id, c.rollout, c.d) for c in store.observed_d(round_id, "searcher")
                  ) == [("q1", 0, 0), ("q1", 1, 2), ("q2", 1, 3)]
    with pytest.raises(ValueError, match="with their attempt"):
        store.finish_episodes(round_id, batch[:1], {"searcher": [DCount(
            query_id="q1", rollout=0, d=1)]})


def begin_attempts_contract(store, round_id: str) -> None:
    """Attempt numbers of a batch, in its order: 0 for a fresh rollout, 1 for one begun
    before, None for a completed one; a rollout named twice in a batch gets two numbers."""
    store.create_run(round_id)
    store.create_round(round_id, round_id, 0, ["q1", "q2"], 2)
    assert store.begin_attempt(round_id, "q1", 1) == 0
    assert store.complete_rollout(round_id, "q2", 0, 0)
    batch = [(round_id, "q1", 0), (round_id, "q1", 1), (round_id, "q2", 0), (round_id, "q2", 1)]
    assert store.begin_attempts(batch) == [0, 1, None, 0]
    assert store.begin_attempts(batch[:1] * 2) == [1, 2]
    assert store.begin_attempts([]) == []


def evaluation_jobs_contract(store, prefix: str) -> None:
    """Evaluation jobs: created running, progress and the end written only by their owner
    while running, a job whose owner holds no unexpired lease swept to interrupted once."""
    import hashlib
    import time

    def job_id(name: str) -> str:
        return hashlib.md5(f"{prefix}/{name}".encode()).hexdigest()

    lease = f"{prefix}-evaluation"
    job_a, job_b, job_c = job_id("a"), job_id("b"), job_id("c")
    assert store.get_evaluation(job_a) is None
    created = store.create_evaluation(job_a, "owner-a", {"n_questions": 5, "split": "test"}, 5)
    assert (created.status, created.played, created.owner) == ("running", 0, "owner-a")
    assert store.acquire_lease(lease, "owner-a", ttl_s=30)
    assert store.update_evaluation(job_a, "owner-a", played=3)
    assert not store.update_evaluation(job_a, "owner-b", played=4)  # not b's job
    assert store.get_evaluation(job_a).played == 3
    assert store.interrupt_orphaned_evaluations(lease, "gone") == []  # a holds its lease
    assert store.update_evaluation(job_a, "owner-a", played=5, status="done",
                                   result={"n": 5, "accuracy": 0.4})
    done = store.get_evaluation(job_a)
    assert (done.status, done.played, done.result) == ("done", 5, {"n": 5, "accuracy": 0.4})
    assert done.finished_at is not None and done.request == {"n_questions": 5, "split": "test"}
    assert not store.update_evaluation(job_a, "owner-a", status="failed", error="late")
    assert store.get_evaluation(job_a).status == "done"  # an ended job stays ended
    with pytest.raises(ValueError, match="ends as one of"):
        store.update_evaluation(job_a, "owner-a", status="running")

    store.create_evaluation(job_b, "owner-b", {"n_questions": 2}, 2)
    assert store.acquire_lease(lease, "owner-a", ttl_s=0.3)  # a's lease: b holds none
    assert store.interrupt_orphaned_evaluations(lease, "owner-b is gone") == [job_b]
    assert store.interrupt_orphaned_evaluations(lease, "again") == []  # swept once
    swept = store.get_evaluation(job_b)
    assert (swept.status, swept.error) == ("interrupted", "owner-b is gone")
    assert swept.finished_at is not None
    assert not store.update_evaluation(job_b, "owner-b", played=1)  # the dead owner's write
    assert store.get_evaluation(job_b).played == 0

    store.create_evaluation(job_c, "owner-a", {}, 1)
    time.sleep(0.6)  # a's 0.3 s lease expired: a is dead
    assert store.interrupt_orphaned_evaluations(lease, "expired") == [job_c]
    newest = [job.evaluation_id for job in store.list_evaluations(limit=50)
              if job.evaluation_id in (job_a, job_b, job_c)]
    assert newest == [job_c, job_b, job_a]
    assert [j.evaluation_id for j in store.list_evaluations(limit=50, status="done")
            if j.evaluation_id in (job_a, job_b, job_c)] == [job_a]


def queued_evaluation_contract(store, prefix: str) -> None:
    """A queued job: no owner, never swept; claimed once (queued -> running, its owner set);
    ended failed only while still queued."""
    import hashlib

    def job_id(name: str) -> str:
        return hashlib.md5(f"{prefix}/queued/{name}".encode()).hexdigest()

    lease = f"{prefix}-queued-evaluation"
    job_a, job_b = job_id("a"), job_id("b")
    queued = store.create_evaluation(job_a, "", {"n_questions": 2}, 2, "queued")
    assert (queued.status, queued.owner) == ("queued", "")
    assert job_a not in store.interrupt_orphaned_evaluations(lease, "gone")  # no lease: kept
    assert not store.update_evaluation(job_a, "", played=1)  # not running: nothing written
    assert store.claim_evaluation(job_a, "worker-1")
    assert not store.claim_evaluation(job_a, "worker-2")  # taken once
    claimed = store.get_evaluation(job_a)
    assert (claimed.status, claimed.owner, claimed.finished_at) == ("running", "worker-1", None)
    assert not store.fail_queued_evaluation(job_a, "dead-lettered")  # running: left alone
    assert store.get_evaluation(job_a).status == "running"

    store.create_evaluation(job_b, "", {"n_questions": 1}, 1, "queued")
    assert store.fail_queued_evaluation(job_b, "dead-lettered: why")
    failed = store.get_evaluation(job_b)
    assert (failed.status, failed.error) == ("failed", "dead-lettered: why")
    assert failed.finished_at is not None
    assert not store.claim_evaluation(job_b, "worker-1")  # ended: never played
    with pytest.raises(ValueError, match="starts running or queued"):
        store.create_evaluation(job_id("c"), "", {}, 1, "done")

    store.create_evaluation(job_id("d"), "", {"n_questions": 1}, 1, "queued")
    assert job_id("d") not in store.expire_queued_evaluations(3600, "lost")  # recent: kept
    assert job_id("d") in store.expire_queued_evaluations(0, "lost")
    assert store.expire_queued_evaluations(0, "again") == []  # ended once
    assert (store.get_evaluation(job_id("d")).status, store.get_evaluation(job_id("d")).error,
            store.get_evaluation(job_a).status) == ("failed", "lost", "running")
