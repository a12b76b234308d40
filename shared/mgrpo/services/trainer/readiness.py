"""When a trainer's part of a round is complete (docs/services.md, 'One round (distributed)',
step 5): every rollout completed AND, for each role its model plays, the completing
attempts' trajectories are all ingested: one per rollout for the planner, and for a sub-agent
each call the planner worker recorded as answered (its invocation numbers; d_k of them), or
d_k trajectories where only the count was recorded. :func:`recorded_only` keeps, of what was
ingested, the recorded calls only: a well-formed trajectory of a live round that the planner
never recorded is not trained. AT-GRPO (``tree``): per rollout (candidate slot) and role, the
counts the planner worker recorded, the planner's too (:data:`ONE_PER_ROLLOUT`, by the round's
play).

What this module does NOT do: decide WHEN to check (the trainer checks when woken: an
ingested batch, a round command) or train.
"""

from __future__ import annotations

from mgrpo.training.config import RunConfig

# a round's play (``RoundSpec.round_play``) -> the roles with one trajectory per rollout; every
# other role's are the ones the planner worker recorded (a tree: each role's candidates)
ONE_PER_ROLLOUT: dict[str, tuple[str, ...]] = {"episodes": ("planner",), "tree": ()}


def roles_of(cfg: RunConfig, model: str) -> list[str]:
    return [role for role, m in cfg.agents.items() if m == model]


def expected_subagent_trajectories(store, role: str, round_id: str) -> tuple[int, int]:
    """(completed rollouts with a recorded d_k, sum of their d_k) of ``role`` in the round;
    completing attempts only (``store.observed_d``)."""
    counts = store.observed_d(round_id, role)
    return len(counts), sum(c.d for c in counts)


def recorded_calls(counts) -> dict[tuple[str, int], set[int]] | None:
    """(query_id, rollout) -> the invocation numbers the planner worker recorded as
    answered, from a role's ``store.observed_d`` rows; None when a row has the count only."""
    if any(c.invocations is None for c in counts):
        return None
    return {(c.query_id, c.rollout): set(c.invocations) for c in counts}


def recorded_only(trajs: list, roles_counts: dict[str, list]) -> tuple[list, list[tuple]]:
    """(kept, dropped): ``trajs`` without the sub-agent trajectories the round's record does
    not name, and those, each with why (``(trajectory, reason)``). A trajectory of role r is
    kept when its (query, rollout) recorded its invocation as answered (``roles_counts``:
    role -> ``store.observed_d`` rows). A role whose rows carry counts only keeps all."""
    calls = {role: recorded_calls(counts) for role, counts in roles_counts.items()}
    kept, dropped = [], []
    for t in trajs:
        named = calls.get(t.agent)
        answered = None if named is None else named.get((t.query_id, t.rollout), set())
        if answered is None or t.invocation in answered:
            kept.append(t)
            continue
        dropped.append((t, unrecorded(t, answered)))
    return kept, dropped


def unrecorded(t, answered) -> str:
    """Why trajectory ``t`` is not trained: its call is not among ``answered``, the
    invocation numbers its rollout's completing attempt recorded."""
    return (f"trajectory {t.traj_id!r} (attempt {t.attempt}): call {t.invocation} of "
            f"{t.agent} in ({t.query_id!r}, rollout {t.rollout}) is not one the planner "
            f"recorded as answered ({sorted(answered)}); it would never be trained")


def round_ready(store, round_id: str, model: str, roles: list[str],
                play: str = "episodes") -> bool:
    """True when this model's part of the round is complete (see the module docstring).
    ``play``: the round's (:data:`ONE_PER_ROLLOUT`); under ``tree`` (AT-GRPO) every role, the
    planner too, has the candidate counts the planner worker recorded per slot (one
    candidate per slot per turn)."""
    progress = store.round_progress(round_id)
    if not progress.done:
        return False
    for role in roles:
        have = store.count_round_trajectories(round_id, model, agent=role)
        if role in ONE_PER_ROLLOUT[play]:
            if have < progress.total:
                return False
            continue
        counts = store.observed_d(round_id, role)
        if len(counts) < progress.total:
            return False
        calls = recorded_calls(counts)
        if calls is not None:  # the recorded calls themselves, not any trajectories
            keys = store.round_trajectory_keys(round_id, model, role)
            if any((query, rollout, invocation) not in keys
                   for (query, rollout), invocations in calls.items()
                   for invocation in invocations):
                return False
        elif have < sum(c.d for c in counts):
            return False
    return True
