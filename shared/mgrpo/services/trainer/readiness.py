"""When a trainer's part of a round is complete (docs/services.md, 'One round (distributed)',
step 5): every rollout completed
AND, for each role its model plays, the completing attempts' trajectories are all ingested:
one per rollout for the planner, d_k per rollout for a sub-agent (d_k recorded by the planner
worker). AT-GRPO (``tree``): per rollout (candidate slot) and role, the counts the planner
worker recorded, the planner's too.

What this module does NOT do: decide WHEN to check (the trainer checks when woken: an
ingested batch, a round command) or train.
"""

from __future__ import annotations

from mgrpo.training.config import RunConfig


def roles_of(cfg: RunConfig, model: str) -> list[str]:
    return [role for role, m in cfg.agents.items() if m == model]


def expected_subagent_trajectories(store, role: str, round_id: str) -> tuple[int, int]:
    """(completed rollouts with a recorded d_k, sum of their d_k) of ``role`` in the round;
    completing attempts only (``store.observed_d``)."""
    counts = store.observed_d(round_id, role)
    return len(counts), sum(c.d for c in counts)


def round_ready(store, round_id: str, model: str, roles: list[str],
                tree: bool = False) -> bool:
    """True when this model's part of the round is complete (see the module docstring).
    ``tree`` (AT-GRPO): every role, the planner too, has the candidate counts the planner
    worker recorded per slot (one candidate per slot per turn)."""
    progress = store.round_progress(round_id)
    if not progress.done:
        return False
    for role in roles:
        have = store.count_round_trajectories(round_id, model, agent=role)
        if role == "planner" and not tree:
            if have < progress.total:
                return False
            continue
        rows, expected = expected_subagent_trajectories(store, role, round_id)
        if rows < progress.total or have < expected:
            return False
    return True
