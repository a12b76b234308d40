"""Reward composition with the format gate (paper Eq. 4-5) and AT-GRPO turn rewards
(docs/algorithm.md, '1.2 Rewards').

The components are given; this module only combines them:
- planner:   ``R_M = a1*r_format + a2*r_correct``                    if the format is valid, else 0
- sub-agent: ``R_S = b1*r_format + b2*r_correct_main + b3*r_expert`` if the format is valid, else 0
- AT-GRPO turn reward: ``r = alpha*r_team + r_local``, r_team the team's score at the end of
  the team turn the candidate starts.

``r_format`` is 1 when the format is valid (the gate), so a valid planner answer that is wrong
still earns a1. Every function accepts Python scalars (returns a float) or tensors / sequences
(returns a float tensor, broadcast elementwise).

What this module does NOT do: judge formats or correctness (that is ``mgrpo.envs`` and the
verifiers), read ``r_correct_main`` from the store (the sub-agent trainer does), or normalise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

PLANNER_WEIGHTS: tuple[float, float] = (0.1, 0.9)
SUBAGENT_WEIGHTS: tuple[float, float, float] = (0.1, 0.4, 0.5)

ArrayLike = float | bool | int | Sequence[float] | Tensor


def _as_tensor(name: str, value: ArrayLike) -> Tensor:
    tensor = torch.as_tensor(value, dtype=torch.float64)
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    return tensor


def _check_unit(name: str, value: Tensor) -> None:
    if ((value < 0) | (value > 1)).any():
        bad = value[(value < 0) | (value > 1)].flatten()[:3].tolist()
        raise ValueError(f"{name} must lie in [0, 1], got {bad}; normalise the score "
                         "(e.g. exact match 0/1, F1, judge score / max)")


def _check_weights(weights: Sequence[float], size: int, name: str) -> None:
    if len(weights) != size or any(not w >= 0 for w in weights):
        raise ValueError(f"{name} weights must be {size} non-negative numbers, got "
                         f"{tuple(weights)}; the paper's default is "
                         f"{PLANNER_WEIGHTS if size == 2 else SUBAGENT_WEIGHTS}")


def _result(value: Tensor, *inputs: ArrayLike) -> float | Tensor:
    """A Python float when every input was a scalar, else a float32 tensor."""
    if all(isinstance(x, float | int | bool) for x in inputs):
        return float(value)
    return value.to(torch.float32)


def planner_reward(format_ok: ArrayLike, correct: ArrayLike,
                   weights: Sequence[float] = PLANNER_WEIGHTS) -> float | Tensor:
    """Planner reward (paper Eq. 4): ``R_M = 1[format_ok] * (a1 + a2 * r_correct)``.

    Args:
        format_ok: bool (or 0/1) per trajectory: the planner's output format is valid.
        correct: r_correct in [0, 1] per trajectory (normalised exact match or a judge score).
        weights: (a1, a2), default (0.1, 0.9).

    Returns:
        float for scalar inputs, else a (N,) float tensor.
    """
    _check_weights(weights, 2, "planner")
    gate = _as_tensor("format_ok", format_ok) != 0
    r_correct = _as_tensor("correct", correct)
    _check_unit("correct", r_correct)
    a1, a2 = weights
    value = torch.where(gate, a1 * 1.0 + a2 * r_correct, torch.zeros_like(r_correct))
    return _result(value, format_ok, correct)


def subagent_reward(format_ok: ArrayLike, correct_main: ArrayLike, expert: ArrayLike,
                    weights: Sequence[float] = SUBAGENT_WEIGHTS) -> float | Tensor:
    """Sub-agent reward (paper Eq. 5).

    ``R_S = 1[format_ok] * (b1 + b2 * r_correct_main + b3 * r_expert)``.

    Args:
        format_ok: bool (or 0/1) per invocation: the sub-agent's output format is valid.
        correct_main: r_correct of the planner rollout that made the call, in [0, 1]
            (the sub-agent trainer reads it from the stats store).
        expert: r_expert in [0, 1]: how well the subtask was done (rule or LLM judge).
        weights: (b1, b2, b3), default (0.1, 0.4, 0.5).

    Returns:
        float for scalar inputs, else a (n,) float tensor.
    """
    _check_weights(weights, 3, "sub-agent")
    gate = _as_tensor("format_ok", format_ok) != 0
    r_main = _as_tensor("correct_main", correct_main)
    r_expert = _as_tensor("expert", expert)
    _check_unit("correct_main", r_main)
    _check_unit("expert", r_expert)
    b1, b2, b3 = weights
    total = b1 * 1.0 + b2 * r_main + b3 * r_expert
    value = torch.where(gate, total, torch.zeros_like(total))
    return _result(value, format_ok, correct_main, expert)


def mix_turn_reward(r_team: ArrayLike, r_local: ArrayLike, alpha: float) -> float | Tensor:
    """AT-GRPO turn reward (Stronger-MAS, arXiv 2510.11062): for candidate k of role
    i at team turn t, ``r_{t,i}^k = alpha * R_team(s_{t+1}^k) + r_local(a_{t,i}^k)``.

    ``s_{t+1}^k`` is the team's state at the end of team turn t reached from candidate k
    (the roles after i each play one action on it: ``mgrpo.training.team_play``), so
    every role's K candidates can differ in their team term, the first role's included.
    Where the team terms of a group are constant, alpha drops out of its group-relative
    advantage; where they are ``c * r_local + b`` with c >= 0 (math_team's reasoner: its
    team reward is its correctness), std scaling removes alpha as well.

    Args:
        r_team: (K,) or scalar, the team reward ``R_team(s_{t+1}^k)`` in [0, 1];
            r_local: (K,) or scalar, the role's own reward of its action.
        alpha: weight of the team term, >= 0.

    Returns:
        float for scalar inputs, else a float tensor.
    """
    if not alpha >= 0:
        raise ValueError(f"alpha={alpha} must be >= 0 (the weight of the team reward)")
    value = alpha * _as_tensor("r_team", r_team) + _as_tensor("r_local", r_local)
    return _result(value, r_team, r_local)
