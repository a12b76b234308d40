"""Store behaviour on SQLite (embedded mode); the same tests' core runs on PostgreSQL in
tests/integration/store."""

from __future__ import annotations

import threading

import pytest

from mgrpo.store import DCount, GroupStatIn, PlannerOutcomeIn, QueryRecord, Store
from mgrpo.store.migrate import head_revision
from mgrpo.types import Trajectory, trajectory_id


def make_traj(round_id="run/0", query_id="q1", rollout=0, agent="planner", model="planner",
              invocation=0, attempt=0, n=5) -> Trajectory:
    return Trajectory(
        traj_id=trajectory_id(round_id, query_id, rollout, agent, invocation), attempt=attempt,
        round_id=round_id, query_id=query_id, rollout=rollout, agent=agent, model=model,
        invocation=invocation, weights_version=3, input_ids=list(range(n)),
        response_mask=[0, 0] + [1] * (n - 2), old_logprobs=[0.0, 0.0] + [-0.5] * (n - 2),
        result="42", extra={"note": "x"})


def new_round(store: Store, round_id="run/0", query_ids=("q1", "q2"), k=2) -> None:
    store.create_run("run")
    assert store.create_round("run", round_id, 0, list(query_ids), k, {"lr": 1e-4})


def test_upgrade_reaches_head_and_is_repeatable(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/sub/dir/store.db")
    assert store.current_revision() is None
    store.upgrade()
    store.upgrade()
    assert store.current_revision() == head_revision() == "0007"


def test_unsupported_url_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="supports .*postgresql"):
        Store("mysql://u@h/db")


def test_create_round_writes_b_times_k_rollouts_once(store):
    new_round(store, query_ids=("q1", "q2", "q3"), k=4)
    assert not store.create_round("run", "run/0", 0, ["q9"], 2)  # duplicate: no change
    assert store.round_progress("run/0").total == 12
    assert store.get_round("run/0").config == {"lr": 1e-4}
    assert [r.round_id for r in store.list_rounds("run")] == ["run/0"]
    with pytest.raises(ValueError, match="repeat an id"):
        store.create_round("run", "run/1", 1, ["a", "a"], 2)


def test_create_round_with_its_queries_starts_running_in_one_commit(store):
    """start_round's path: the queries' rows, the round already 'running' (started_at
    stamped) and its rollouts, in one transaction (one commit, not three)."""
    store.create_run("run")
    commits: list[int] = []
    from sqlalchemy import event

    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    queries = [QueryRecord(query_id=q, question=f"what is {q}?", answer=q.upper(),
                           meta={"kind": "lookup"}) for q in ("q1", "q2")]
    assert store.create_round("run", "run/0", 0, ["q1", "q2"], 3, {}, queries=queries,
                              running=True)
    assert len(commits) == 1
    info = store.get_round("run/0")
    assert info.status == "running" and info.started_at is not None
    assert store.get_query("q2").question == "what is q2?" and store.get_query("q2").answer == "Q2"
    assert store.round_progress("run/0").total == 6
    # a round that exists: nothing written, its queries included
    assert not store.create_round("run", "run/0", 0, ["q1"], 1, {}, queries=[
        QueryRecord(query_id="q1", question="changed", answer="x")], running=True)
    assert store.get_query("q1").question == "what is q1?"


def test_round_status_stamps_timings(store):
    new_round(store)
    store.set_round_status("run/0", "running")
    store.set_round_status("run/0", "done")
    info = store.get_round("run/0")
    assert info.status == "done" and info.started_at <= info.finished_at
    assert info.started_at.tzinfo is not None
    with pytest.raises(KeyError):
        store.set_round_status("nope", "done")


def test_round_status_compare_and_set_never_undoes_a_later_move(store):
    new_round(store)
    store.set_round_status("run/0", "running")
    assert store.set_round_status("run/0", "done", only_from=("running", "training"))
    # the planner decided on a read of 'running' taken before the trainer's 'done'
    assert not store.set_round_status("run/0", "training", only_from=("running",))
    assert store.get_round("run/0").status == "done"
    store.set_round_status("run/0", "cancelled")
    assert not store.set_round_status("run/0", "done", only_from=("running", "training"))
    assert store.get_round("run/0").status == "cancelled"


def test_first_completing_attempt_wins(store):
    new_round(store)
    assert store.begin_attempt("run/0", "q1", 0) == 0
    assert store.begin_attempt("run/0", "q1", 0) == 1  # re-run after a crash
    assert store.complete_rollout("run/0", "q1", 0, attempt=1)
    assert not store.complete_rollout("run/0", "q1", 0, attempt=0)  # zombie attempt ignored
    assert store.begin_attempt("run/0", "q1", 0) is None
    progress = store.round_progress("run/0")
    assert (progress.total, progress.completed, progress.done) == (4, 1, False)


def test_duplicate_trajectory_gives_one_row(store):
    traj = make_traj()
    assert store.ingest_trajectory(traj)
    assert not store.ingest_trajectory(traj)
    assert store.ingest_trajectory(traj.model_copy(update={"attempt": 1}))  # another attempt
    assert store.count_trajectories("run/0") == 2


def test_round_trajectories_only_of_the_completing_attempt(store):
    new_round(store)
    # attempt 0 of (q1, 0) crashed after sending a planner and a searcher trajectory
    store.ingest_trajectories([make_traj(attempt=0),
                               make_traj(agent="searcher", model="searcher", attempt=0)])
    store.ingest_trajectories([make_traj(attempt=1),
                               make_traj(agent="searcher", model="searcher", attempt=1,
                                         invocation=1)])
    store.ingest_trajectory(make_traj(query_id="q2", attempt=0))  # q2 never completed
    assert store.round_trajectories("run/0", "planner") == []
    store.complete_rollout("run/0", "q1", 0, attempt=1)
    planner = store.round_trajectories("run/0", "planner")
    searcher = store.round_trajectories("run/0", "searcher")
    assert [(t.query_id, t.attempt) for t in planner] == [("q1", 1)]
    assert [(t.attempt, t.invocation) for t in searcher] == [(1, 1)]
    assert planner[0] == make_traj(attempt=1)  # round trip: every field, token arrays intact
    # the payload-free count agrees, and also sees only the completing attempt
    assert store.count_round_trajectories("run/0", "planner") == 1
    assert store.count_round_trajectories("run/0", "searcher", agent="searcher") == 1
    assert store.count_round_trajectories("run/0", "searcher", agent="planner") == 0
    assert store.count_trajectories("run/0") == 5  # every attempt is still stored


def test_mismatched_token_arrays_are_refused(store):
    bad = make_traj().model_copy(update={"old_logprobs": [0.0]})
    with pytest.raises(ValueError, match="one entry per token"):
        store.ingest_trajectory(bad)


def test_planner_outcomes_read_back_for_completing_attempts(store):
    new_round(store)
    rows = [PlannerOutcomeIn(query_id="q1", rollout=0, attempt=a, format_ok=True,
                             correct=float(a), reward=0.1 + 0.9 * a) for a in (0, 1)]
    assert store.write_planner_outcomes("run/0", rows) == 2
    assert store.write_planner_outcomes("run/0", rows) == 0
    store.complete_rollout("run/0", "q1", 0, attempt=1)
    outcomes = store.read_planner_outcomes("run/0")
    assert [(o.query_id, o.attempt, o.correct, o.reward) for o in outcomes] == [
        ("q1", 1, 1.0, pytest.approx(1.0))]


def test_group_stats_publish_and_republish(store):
    rows = [GroupStatIn(group_key="q1", n=4, mean=0.5, std=0.25),
            GroupStatIn(group_key="q2", n=4, mean=0.0, std=0.0)]
    store.publish_group_stats("run/0", "searcher", "searcher", rows, published_by="trainer-a")
    store.publish_group_stats("run/0", "searcher", "searcher",
                              [GroupStatIn(group_key="q1", n=4, mean=0.75, std=0.1)],
                              published_by="trainer-b")
    stats = store.read_group_stats("run/0", model="searcher")
    assert [(s.group_key, s.mean, s.published_by) for s in stats] == [
        ("q1", 0.75, "trainer-b"), ("q2", 0.0, "trainer-a")]
    assert store.published_models("run/0") == {"searcher"}


def test_a_models_stats_of_every_role_publish_whole_or_not_at_all(store):
    row = GroupStatIn(group_key="q1", n=2, mean=0.5, std=0.5)
    with pytest.raises(ValueError):  # the second role's row is invalid: nothing is written
        store.publish_model_stats("run/0", "shared", {"planner": [row], "searcher": [
            {"group_key": "q1", "n": -1, "mean": 0.0, "std": 0.0}]}, published_by="t")
    assert store.read_group_stats("run/0") == [] and store.published_models("run/0") == set()
    assert store.publish_model_stats("run/0", "shared", {"planner": [row], "searcher": [row]},
                                     published_by="t") == 2
    assert [(s.agent, s.group_key) for s in store.read_group_stats("run/0")] == [
        ("planner", "q1"), ("searcher", "q1")]


def test_checkpoints_latest_version(store):
    assert store.latest_checkpoint("planner", run_id="a") is None
    for version in (1, 3, 2):
        assert store.record_checkpoint("planner", version, f"file:///c/{version}", "a" * 64,
                                       run_id="a")
    assert not store.record_checkpoint("planner", 3, "file:///c/3", "a" * 64, run_id="a")
    latest = store.latest_checkpoint("planner", run_id="a")
    assert (latest.version, latest.uri, latest.run_id) == (3, "file:///c/3", "a")
    with pytest.raises(ValueError, match="64-character"):
        store.record_checkpoint("planner", 4, "u", "abc", run_id="a")


def test_checkpoint_conflict_raises_and_versions_are_per_run(store):
    from store_contracts import checkpoint_contract

    checkpoint_contract(store, "planner")


def test_agent_registry_and_heartbeat(store):
    store.register_agent("searcher", model="searcher", queue="subagent.searcher", tool="search",
                         description="looks things up")
    store.register_agent("searcher", model="searcher-v2", queue="subagent.searcher",
                         tool="search", description="looks things up better")
    assert store.heartbeat("searcher") and not store.heartbeat("ghost")
    agents = store.list_agents(alive_within_s=60)
    assert [(a.name, a.model, a.description) for a in agents] == [
        ("searcher", "searcher-v2", "looks things up better")]


def test_claim_message_first_true_then_false(store):
    assert not store.message_seen("m1")
    assert store.claim_message("m1", consumer="trainer.planner")
    assert not store.claim_message("m1")
    assert store.message_seen("m1")


def test_metrics_upsert(store):
    store.record_metrics("run", "run/0", {"planner/reward_mean": 0.25, "planner/loss": 1.0})
    store.record_metrics("run", "run/0", {"planner/reward_mean": 0.5})
    store.record_metrics("run", "run/1", {"planner/reward_mean": 0.75})
    assert store.metrics("run") == {"run/0": {"planner/reward_mean": 0.5, "planner/loss": 1.0},
                                    "run/1": {"planner/reward_mean": 0.75}}


def test_d_counts_newest_first_and_idempotent(store):
    new_round(store, query_ids=("q1",), k=3)
    counts = [DCount(query_id="q1", rollout=r, d=d, attempt=0) for r, d in enumerate([0, 2, 5])]
    assert store.record_d_counts("searcher", "run/0", counts) == 3
    assert store.record_d_counts("searcher", "run/0", counts) == 0
    assert store.d_counts("searcher") == []  # no rollout completed yet: nothing counts
    for rollout in range(3):
        assert store.complete_rollout("run/0", "q1", rollout, 0)
    assert store.create_round("run", "run/1", 1, ["q1"], 1)
    assert store.complete_rollout("run/1", "q1", 0, 0)
    # attempt=None: the completing attempt's (the embedded loop writes after completion)
    store.record_d_counts("searcher", "run/1", [DCount(query_id="q1", rollout=0, d=1)])
    assert store.d_counts("searcher") == [1, 5, 2, 0]
    assert store.d_counts("searcher", last_n=2) == [1, 5]
    assert store.d_counts("coder") == []
    assert store.observed_d("run/1", "searcher") == [
        DCount(query_id="q1", rollout=0, d=1, attempt=0)]


def test_d_counts_of_an_abandoned_attempt_are_never_read(store):
    """The d_k crash window: attempt 0 wrote d_k and died before complete_rollout; attempt 1
    re-ran the rollout and completed it. Only attempt 1's d_k counts."""
    new_round(store, query_ids=("q1",), k=2)
    store.record_d_counts("searcher", "run/0", [DCount(query_id="q1", rollout=0, d=3,
                                                       attempt=0)])
    store.record_d_counts("searcher", "run/0", [DCount(query_id="q1", rollout=0, d=1,
                                                       attempt=1),
                                                DCount(query_id="q1", rollout=1, d=2,
                                                       attempt=0)])
    assert store.complete_rollout("run/0", "q1", 0, 1)
    assert store.complete_rollout("run/0", "q1", 1, 0)
    assert [(c.rollout, c.attempt, c.d) for c in store.observed_d("run/0", "searcher")] == [
        (0, 1, 1), (1, 0, 2)]
    assert sorted(store.d_counts("searcher")) == [1, 2]
    assert store.observed_d("run/0", "coder") == []


def test_d_count_without_attempt_needs_a_completed_rollout(store):
    new_round(store, query_ids=("q1",), k=1)
    with pytest.raises(ValueError, match="not completed; pass DCount\\(attempt=...\\)"):
        store.record_d_counts("searcher", "run/0", [DCount(query_id="q1", rollout=0, d=1)])


def test_queries_upsert(store):
    new_round(store)  # creates bare q1, q2
    store.upsert_queries([QueryRecord(query_id="q1", question="Who?", answer="Ada")])
    assert store.get_query("q1").answer == "Ada"
    assert store.get_query("q2").question is None


def test_concurrent_ingestion_from_threads_gives_exact_rows(store):
    trajs = [make_traj(query_id=f"q{i % 5}", rollout=i % 3, invocation=i) for i in range(30)]
    results: list[int] = []

    def worker() -> None:  # every thread ingests all 30, in its own order
        results.append(sum(store.ingest_trajectory(t) for t in reversed(trajs)))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(results) == 30
    assert store.count_trajectories() == 30


def test_migration_0002_gives_old_checkpoints_their_run(tmp_path):
    from store_contracts import migration_0002_contract

    migration_0002_contract(f"sqlite:///{tmp_path}/old.db")


def test_lease_one_holder_renewal_and_takeover_after_expiry(store):
    from store_contracts import lease_contract

    lease_contract(store, "trainer:planner")


def test_finish_episodes_writes_a_batch_and_first_attempt_wins(store):
    from store_contracts import finish_episodes_contract

    finish_episodes_contract(store, "round-finish")


def test_begin_attempts_numbers_a_batch_in_order(store):
    from store_contracts import begin_attempts_contract

    begin_attempts_contract(store, "round-begin")


def test_evaluation_jobs_owner_writes_and_orphans_swept(store):
    from store_contracts import evaluation_jobs_contract

    evaluation_jobs_contract(store, "sqlite")


def test_a_queued_evaluation_is_claimed_once_or_failed(store):
    from store_contracts import queued_evaluation_contract

    queued_evaluation_contract(store, "sqlite")


def test_a_file_database_runs_wal_without_a_sync_per_commit(tmp_path):
    from sqlalchemy import text

    from mgrpo.store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    with store.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    store.close()
