"""Crash windows of the distributed round, driven step by step on a SQLite store: a worker
"killed" (an exception) right after a given store call, then the redelivery. No broker and no
model: the planner worker's hand-off of a played batch (``PlannerWorker._finish``: outcomes,
d_k and completed rollouts in ONE transaction) is called with an episode built by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mgrpo.bus import InMemoryBus
from mgrpo.envs.questions import Question
from mgrpo.services.context import Queues, round_spec
from mgrpo.services.planner.worker import PlannerWorker
from mgrpo.services.trainer.service import round_ready
from mgrpo.store import Store
from mgrpo.training.config import ModelConfig, RunConfig
from mgrpo.training.episodes import Episode, EpisodeJob
from mgrpo.training.judging import verifier_for_run
from mgrpo.types import Trajectory, trajectory_id

ROUND = "run-r0000"
AGENTS = {"planner": "planner", "searcher": "searcher"}


class Killed(Exception):
    """Stands for SIGKILL at one point of the worker."""


class KillAfter:
    """The store, except that the worker dies right AFTER ``method`` returns (``before``:
    right before it is called)."""

    def __init__(self, store: Store, method: str, before: bool = False) -> None:
        self._store, self._method, self._before = store, method, before

    def __getattr__(self, name):
        target = getattr(self._store, name)
        if name != self._method:
            return target

        def call(*args, **kwargs):
            if not self._before:
                target(*args, **kwargs)
            raise Killed(name)
        return call


def finish(worker: PlannerWorker, played: Episode) -> None:
    record = worker.p.store.get_round(ROUND)
    worker._finish(record, round_spec(record, worker.p.cfg), [played])


def traj(agent: str, attempt: int, invocation: int = 0) -> Trajectory:
    return Trajectory(traj_id=trajectory_id(ROUND, "q1", 0, agent, invocation),
                      attempt=attempt, round_id=ROUND, query_id="q1", rollout=0, agent=agent,
                      model=agent, invocation=invocation, input_ids=[1, 2, 3],
                      response_mask=[0, 1, 1], old_logprobs=[0.0, -0.1, -0.2])


def episode(attempt: int) -> Episode:
    """One searcher call answered (d_k = 1), answer correct."""
    job = EpisodeJob(Question(id="q1", question="capital of X?", answer="Y"), ROUND, 0,
                     seed=0, attempt=attempt)
    trace = [{"agent": "searcher", "task": "X", "format_ok": True, "result": "Y"}]
    return Episode(job, traj("planner", attempt), [], "Y", True, trace)


def worker(store) -> PlannerWorker:
    cfg = RunConfig(agents=AGENTS, models={m: ModelConfig(path="unused") for m in AGENTS})
    verifier = verifier_for_run(cfg)
    planner = SimpleNamespace(store=store, cfg=cfg, runtime=SimpleNamespace(model="planner"),
                              bus=InMemoryBus(), queues=Queues(), verifier=lambda _: verifier)
    return PlannerWorker(planner)


@pytest.fixture
def store(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/store.db")
    store.upgrade()
    store.create_run("run")
    store.create_round("run", ROUND, 0, ["q1"], 1,
                       {"agents": AGENTS, "trained_models": ["searcher"]})
    yield store
    store.close()


def test_killed_right_after_finishing_leaves_d_k_for_the_trainer(store):
    """An old order (complete, THEN d_k) left a completed rollout without d_k here: its
    sub-agent trainer waited for ever. Now d_k and the completion commit together."""
    attempt = store.begin_attempt(ROUND, "q1", 0)
    store.ingest_trajectory(traj("searcher", attempt))
    with pytest.raises(Killed):
        finish(worker(KillAfter(store, "finish_episodes")), episode(attempt))
    assert store.begin_attempt(ROUND, "q1", 0) is None  # the redelivery has nothing to do
    assert [(c.attempt, c.d) for c in store.observed_d(ROUND, "searcher")] == [(attempt, 1)]
    assert round_ready(store, ROUND, "searcher", ["searcher"])


def test_killed_before_finishing_the_new_attempt_counts(store):
    """Attempt 0 made a call (its trajectory is in) and dies before its outcome, d_k = 1 and
    completion commit; the redelivery plays attempt 1, which makes no call (d_k = 0). The
    trainer must expect 0, not 1."""
    first = store.begin_attempt(ROUND, "q1", 0)
    store.ingest_trajectory(traj("searcher", first))
    with pytest.raises(Killed):
        finish(worker(KillAfter(store, "finish_episodes", before=True)), episode(first))
    assert store.round_progress(ROUND).completed == 0
    second = store.begin_attempt(ROUND, "q1", 0)
    assert second == first + 1
    replay = episode(second)
    replay.trace = []
    finish(worker(store), replay)
    assert [(c.attempt, c.d) for c in store.observed_d(ROUND, "searcher")] == [(second, 0)]
    assert store.d_counts("searcher") == [0]
    assert round_ready(store, ROUND, "searcher", ["searcher"])
    assert store.round_trajectories(ROUND, "searcher") == []  # attempt 0's call is not read


def test_finish_episodes_writes_all_or_nothing(store):
    """Outcomes, d_k and completions are one transaction: an error after the outcomes were
    written (a d_k without its attempt) leaves the rollout as it was."""
    from mgrpo.store.records import DCount, PlannerOutcomeIn

    attempt = store.begin_attempt(ROUND, "q1", 0)
    outcome = PlannerOutcomeIn(query_id="q1", rollout=0, attempt=attempt, format_ok=True,
                               correct=1.0, reward=1.0)
    with pytest.raises(ValueError, match="with their attempt"):
        store.finish_episodes(ROUND, [outcome], {"searcher": [DCount(query_id="q1", rollout=0,
                                                                     d=1)]})
    assert store.round_progress(ROUND).completed == 0
    assert store.finish_episodes(ROUND, [outcome], {"searcher": [DCount(
        query_id="q1", rollout=0, d=1, attempt=attempt)]}) == [True]
    assert [(o.attempt, o.reward) for o in store.read_planner_outcomes(ROUND)] == [(attempt, 1.0)]
    assert [(c.attempt, c.d) for c in store.observed_d(ROUND, "searcher")] == [(attempt, 1)]
