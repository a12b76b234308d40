"""The trainer's readiness rule for AT-GRPO's tree-shaped groups (issue 10): a slot (rollout)
of a tree holds one candidate per turn of each agent, the planner's too, so "one planner
trajectory per rollout" (the M-GRPO rule) would train on half a tree. The planner worker
records each role's turns per slot; the trainer waits for all of them."""

from __future__ import annotations

from mgrpo.services.trainer.service import round_ready
from mgrpo.store import Store
from mgrpo.store.records import DCount
from mgrpo.types import Trajectory

K, TURNS = 2, 3  # two candidate slots, three planner turns in the tree


def _candidate(slot: int, turn: int, attempt: int) -> Trajectory:
    return Trajectory(traj_id=f"r/q/{slot}/planner/0/t{turn}", attempt=attempt, round_id="r",
                      query_id="q", rollout=slot, agent="planner", model="planner", turn=turn,
                      input_ids=[1, 2], response_mask=[0, 1], old_logprobs=[0.0, -1.0],
                      reward=0.5)


def test_a_tree_round_waits_for_every_turns_candidates(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    store.upgrade()
    store.create_run("run")
    store.create_round("run", "r", 0, ["q"], K, {"algorithm": "at_grpo"})
    attempts = [store.begin_attempt("r", "q", k) for k in range(K)]
    for k, attempt in enumerate(attempts):
        store.record_d_counts("planner", "r", [DCount(query_id="q", rollout=k, attempt=attempt,
                                                      d=TURNS)])
        store.ingest_trajectories([_candidate(k, 0, attempt)])  # first turn only, so far
        store.complete_rollout("r", "q", k, attempt)
    assert round_ready(store, "r", "planner", ["planner"])  # the M-GRPO rule: fooled
    assert not round_ready(store, "r", "planner", ["planner"], play="tree")
    store.ingest_trajectories([_candidate(k, t, attempts[k]) for k in range(K)
                               for t in range(1, TURNS)])
    assert round_ready(store, "r", "planner", ["planner"], play="tree")
    store.close()
