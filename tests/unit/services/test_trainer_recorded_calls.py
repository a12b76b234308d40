"""A sub-agent trainer trains the calls the planner worker recorded as answered, by their
invocation numbers (``observed_d.invocations``), nothing else that reached its queue: a
well-formed trajectory of a live round under an invocation the record does not name neither
makes the round ready in the place of a missing real one nor is trained. Before, readiness
counted trajectories (d_k of any) and training took every ingested one of the completing
attempt."""

from __future__ import annotations

import pytest

from mgrpo.services.planner.worker import answered_calls, answered_invocations
from mgrpo.services.trainer.readiness import recorded_only, round_ready
from mgrpo.store import DCount, PlannerOutcomeIn
from mgrpo.types import Trajectory


def searcher(round_id: str, query: str, invocation: int, attempt: int = 0) -> Trajectory:
    return Trajectory(traj_id=f"{round_id}/{query}/0/searcher/{invocation}", attempt=attempt,
                      round_id=round_id, query_id=query, rollout=0, agent="searcher",
                      model="searcher", invocation=invocation, input_ids=[1, 2, 3],
                      response_mask=[0, 1, 1], old_logprobs=[0.0, -0.5, -0.5])


def test_an_unrecorded_invocation_neither_readies_nor_trains(store):
    rid = "run-r0000"
    store.create_run("run")
    store.create_round("run", rid, 0, ["q1"], 1, running=True)
    # the planner answered calls 0 and 2 of the searcher (call 1 timed out): d = 2
    store.finish_episodes(rid, [PlannerOutcomeIn(query_id="q1", rollout=0, attempt=0,
                                                 format_ok=True, correct=1.0, reward=1.0)],
                          {"searcher": [DCount(query_id="q1", rollout=0, attempt=0, d=2,
                                               invocations=[0, 2])]})
    store.ingest_trajectories([searcher(rid, "q1", 0), searcher(rid, "q1", 7)])  # 7: hostile
    assert not round_ready(store, rid, "searcher", ["searcher"])  # call 2 is still missing
    store.ingest_trajectories([searcher(rid, "q1", 1)])  # the late reply of the timed-out call
    assert not round_ready(store, rid, "searcher", ["searcher"])
    store.ingest_trajectories([searcher(rid, "q1", 2)])
    assert round_ready(store, rid, "searcher", ["searcher"])
    trained, dropped = recorded_only(store.round_trajectories(rid, "searcher"),
                                     {"searcher": store.observed_d(rid, "searcher")})
    assert sorted(t.invocation for t in trained) == [0, 2]
    assert sorted(t.invocation for t, _ in dropped) == [1, 7]
    assert all("is not one the planner recorded as answered ([0, 2]); it would never be "
               "trained" in why
               for _, why in dropped)


def test_a_count_only_record_keeps_counting(store):
    """Rows without invocation numbers (embedded runs, older rows): d_k trajectories of any
    invocation make the round ready, and all of them train."""
    rid = "run-r0000"
    store.create_run("run")
    store.create_round("run", rid, 0, ["q1"], 1, running=True)
    store.finish_episodes(rid, [PlannerOutcomeIn(query_id="q1", rollout=0, attempt=0,
                                                 format_ok=True, correct=1.0, reward=1.0)],
                          {"searcher": [DCount(query_id="q1", rollout=0, attempt=0, d=1)]})
    store.ingest_trajectories([searcher(rid, "q1", 3)])
    assert round_ready(store, rid, "searcher", ["searcher"])
    kept, dropped = recorded_only(store.round_trajectories(rid, "searcher"),
                                  {"searcher": store.observed_d(rid, "searcher")})
    assert (len(kept), dropped) == (1, [])


def test_the_planner_trace_names_the_answered_invocations():
    trace = [
        {"agent": "planner", "delegate": "searcher", "task": "a"},
        {"agent": "searcher", "invocation": 0, "format_ok": True, "result": "x", "steps": []},
        {"agent": "searcher", "task": "b", "error": "timed out"},
        {"agent": "coder", "invocation": 0, "format_ok": False, "result": "y", "steps": [
            {"calls": [{"agent": "searcher", "invocation": 4, "format_ok": True}]}]},
    ]
    assert answered_calls(trace, "searcher") == 2
    assert answered_invocations(trace, "searcher") == [0, 4]
    assert answered_invocations(trace, "coder") == [0]
    # an answer without its number (an older sub-agent worker): the count only
    assert answered_invocations([{"agent": "searcher", "format_ok": True}], "searcher") is None
    with pytest.raises(ValueError, match="invocations"):
        DCount(query_id="q", rollout=0, d=2, invocations=[1, 1])


def test_ingest_refuses_an_unrecorded_call_of_a_completed_rollout(store):
    """Once the rollout is completed, a trajectory under a call number its record does not
    name is refused at ingest (a dead letter with why); before, it is stored (and left out
    when the round trains); another attempt's (a zombie's) is stored as always."""
    from mgrpo.bus.messages import TrajectoryMessage
    from mgrpo.services.trainer.ingest import TrajectoryIngest

    rid = "run-r0000"
    store.create_run("run")
    store.create_round("run", rid, 0, ["q1"], 1, running=True)
    ingest = TrajectoryIngest(store, "searcher")
    early = ingest.handle_batch([TrajectoryMessage(trajectory=searcher(rid, "q1", 5))])
    assert early == {}  # not completed yet: what the planner will record is not known
    store.finish_episodes(rid, [PlannerOutcomeIn(query_id="q1", rollout=0, attempt=0,
                                                 format_ok=True, correct=1.0, reward=1.0)],
                          {"searcher": [DCount(query_id="q1", rollout=0, attempt=0, d=1,
                                               invocations=[0])]})
    refused = ingest.handle_batch([TrajectoryMessage(trajectory=searcher(rid, "q1", 0)),
                                   TrajectoryMessage(trajectory=searcher(rid, "q1", 9)),
                                   TrajectoryMessage(trajectory=searcher(rid, "q1", 9, 3))])
    assert list(refused) == [1], refused
    assert "call 9 of searcher in ('q1', rollout 0) is not one the planner recorded as " \
           "answered ([0]); it would never be trained" in refused[1]
    assert store.round_trajectory_keys(rid, "searcher", "searcher") == {("q1", 0, 0),
                                                                          ("q1", 0, 5)}
