"""The training algorithms, registered by name: ``mgrpo``, ``at_grpo``, ``grpo``.

An algorithm is one small object: how its rounds are played, how its samples are grouped and
scored, and which options it allows. Both modes (embedded and the services) look it up here
and read its fields; no code outside this module compares algorithm names.

| name    | play     | groups (advantage estimator)       | turns/sample | async | KL in reward |
| ------- | -------- | ---------------------------------- | ------------ | ----- | ------------ |
| mgrpo   | delegate | planner: query; sub-agent: query,  | longest      | yes   | yes          |
|         |          | after alignment to d (``mgrpo``)   | agent's      |       |              |
| at_grpo | tree     | (query, agent, turn) (``at_grpo``) | 1            | no    | no           |
| grpo    | inline   | query (``grpo``)                   | planner's +  | yes   | yes          |
|         |          |                                    | inline calls |       |              |

``play``: ``delegate`` - the planner delegates to sub-agents, each its own agent (a local pool
embedded, the sub-agent workers over the bus distributed); ``inline`` - one agent, the planner,
plays every role in its own context and calls the tools itself (no sub-agent services);
``tree`` - AT-GRPO's tree sampling: K candidates per turn, the best one continues, sub-agent
subtrees played by the sub-agent workers as tree calls.

What this module does NOT do: play episodes, compute advantages (``mgrpo.algo.estimators``)
or validate a run config (``mgrpo.training.config`` asks :func:`get_algorithm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Play = Literal["delegate", "inline", "tree"]
SampleTurns = Literal["longest_agent", "planner_with_inline_calls", "one"]


@dataclass(frozen=True)
class Algorithm:
    name: str
    title: str  # as the papers write it
    description: str
    play: Play
    estimator: str  # the advantage estimator (mgrpo.algo.estimators) that groups its samples
    sample_turns: SampleTurns  # the most turns one trained sample spans (Dr. GRPO's L)
    asynchronous: bool  # may sample round n+1 while round n trains (max_staleness > 0)
    kl_in_reward: bool  # takes loss.kl_in_reward (a KL penalty on each trajectory's reward)

    @property
    def tree(self) -> bool:
        """Rounds are played as trees (one task per query; per-turn groups of K)."""
        return self.play == "tree"

    @property
    def inline(self) -> bool:
        """One agent, the planner, plays every role (no sub-agent agents or workers)."""
        return self.play == "inline"

    def max_turns(self, planner_max_turns: int, subagent_max_turns: int) -> int:
        """Turns one trained sample can span, for the loss's constant length."""
        if self.sample_turns == "one":
            return 1
        if self.sample_turns == "planner_with_inline_calls":
            return planner_max_turns * (1 + subagent_max_turns)
        return max(planner_max_turns, subagent_max_turns)


_ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Register ``algorithm`` under its name; a second, different one of that name is refused."""
    known = _ALGORITHMS.get(algorithm.name)
    if known is not None and known != algorithm:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered; pick another "
                         "name")
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; an unknown name lists the valid ones."""
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: {algorithm_names()}") from None


def algorithm_names() -> list[str]:
    return sorted(_ALGORITHMS)


register_algorithm(Algorithm(
    name="mgrpo", title="M-GRPO", play="delegate", estimator="mgrpo",
    sample_turns="longest_agent", asynchronous=True, kl_in_reward=True,
    description="planner + sub-agents, per-agent groups with alignment"))
register_algorithm(Algorithm(
    name="at_grpo", title="AT-GRPO", play="tree", estimator="at_grpo", sample_turns="one",
    asynchronous=False, kl_in_reward=False,
    description="tree sampling, groups (query, agent, turn)"))
register_algorithm(Algorithm(
    name="grpo", title="GRPO", play="inline", estimator="grpo",
    sample_turns="planner_with_inline_calls", asynchronous=True,
    kl_in_reward=True,
    description="single agent, the planner calls the tools itself"))
