"""Crash windows of the distributed round, driven step by step on a SQLite store: a worker
"killed" (an exception) right after a given store call, then the redelivery. No broker and no
model: the planner worker's per-episode hand-off (``PlannerWorker._finish``) is called with a
scored episode built by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mgrpo.bus import InMemoryBus
from mgrpo.envs.questions import Question
from mgrpo.services.context import Queues
from mgrpo.services.planner_worker import PlannerWorker
from mgrpo.services.trainer import round_ready
from mgrpo.store import Store
from mgrpo.training.config import ModelConfig, RunConfig
from mgrpo.training.episodes import Episode, EpisodeJob
from mgrpo.types import Trajectory, trajectory_id

ROUND = "run-r0000"
AGENTS = {"planner": "planner", "searcher": "searcher"}


class Killed(Exception):
    """Stands for SIGKILL at one point of the worker."""


class KillAfter:
    """The store, except that the worker dies right AFTER ``method`` returns."""

    def __init__(self, store: Store, method: str) -> None:
        self._store, self._method = store, method

    def __getattr__(self, name):
        target = getattr(self._store, name)
        if name != self._method:
            return target

        def call(*args, **kwargs):
            target(*args, **kwargs)
            raise Killed(name)
        return call


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
    planner = SimpleNamespace(store=store, cfg=cfg, runtime=SimpleNamespace(model="planner"),
                              bus=InMemoryBus(), queues=Queues())
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


def test_killed_right_after_complete_rollout_leaves_d_k_for_the_trainer(store):
    """The old order (complete, THEN d_k) left a completed rollout without d_k here: its
    sub-agent trainer waited for ever. Now complete_rollout is the last write."""
    attempt = store.begin_attempt(ROUND, "q1", 0)
    store.ingest_trajectory(traj("searcher", attempt))
    with pytest.raises(Killed):
        worker(KillAfter(store, "complete_rollout"))._finish(episode(attempt))
    assert store.begin_attempt(ROUND, "q1", 0) is None  # the redelivery has nothing to do
    assert [(c.attempt, c.d) for c in store.observed_d(ROUND, "searcher")] == [(attempt, 1)]
    assert round_ready(store, ROUND, "searcher", ["searcher"])


def test_killed_after_d_k_before_complete_the_new_attempt_counts(store):
    """Attempt 0 writes d_k = 1 and dies before complete_rollout; the redelivery plays
    attempt 1, which makes no call (d_k = 0). The trainer must expect 0, not 1."""
    first = store.begin_attempt(ROUND, "q1", 0)
    store.ingest_trajectory(traj("searcher", first))
    with pytest.raises(Killed):
        worker(KillAfter(store, "record_d_counts"))._finish(episode(first))
    assert store.round_progress(ROUND).completed == 0
    second = store.begin_attempt(ROUND, "q1", 0)
    assert second == first + 1
    replay = episode(second)
    replay.trace = []
    worker(store)._finish(replay)
    assert [(c.attempt, c.d) for c in store.observed_d(ROUND, "searcher")] == [(second, 0)]
    assert store.d_counts("searcher") == [0]
    assert round_ready(store, ROUND, "searcher", ["searcher"])
    assert store.round_trajectories(ROUND, "searcher") == []  # attempt 0's call is not read
