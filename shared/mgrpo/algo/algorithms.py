"""The training algorithms, registered by name: ``mgrpo``, ``at_grpo``, ``grpo``.

An algorithm is one small object: how its rounds are played, which registered estimator
groups and scores its samples, how many turns a sample spans, and which options it allows.
Both modes (embedded and the services) look it up here (``register_algorithm`` /
``get_algorithm`` / ``algorithm_names``, the one registry form of ``mgrpo.registry``) and read
its fields; no code outside this module compares algorithm names.

| name    | play     | groups (advantage estimator)       | max_turns    | async | KL in reward |
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mgrpo.registry import Registry

Play = Literal["delegate", "inline", "tree"]
MaxTurns = Callable[[int, int], int]  # (planner_max_turns, subagent_max_turns) -> turns


def longest_agent(planner_max_turns: int, subagent_max_turns: int) -> int:
    """A sample is one agent's trajectory: the longer agent's turn limit."""
    return max(planner_max_turns, subagent_max_turns)


def planner_with_inline_calls(planner_max_turns: int, subagent_max_turns: int) -> int:
    """A sample is the planner's trajectory with every call's turns played inline."""
    return planner_max_turns * (1 + subagent_max_turns)


def one_turn(planner_max_turns: int, subagent_max_turns: int) -> int:
    """A sample is one turn's action."""
    return 1


@dataclass(frozen=True)
class Algorithm:
    """One training algorithm: how its rounds are played (``play``), the registered advantage
    estimator that scores its samples (``estimator``, ``mgrpo.algo.estimators``) and that
    estimator's default groups (``grouping``, ``GROUPINGS``), the most turns one trained
    sample spans (``max_turns``: Dr. GRPO's L), and which options it allows."""

    name: str
    title: str  # as the papers write it
    description: str
    play: Play
    estimator: str
    grouping: str  # which of (query, agent, turn) key a group (workflow.grouping overrides)
    max_turns: MaxTurns
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


ALGORITHMS: Registry[Algorithm] = Registry(
    "algorithm", hint="one of your own: register_algorithm(name, Algorithm(...)) in a module "
    "named under `plugins:`")
register_algorithm = ALGORITHMS.register
get_algorithm = ALGORITHMS.get
algorithm_names = ALGORITHMS.names


register_algorithm("mgrpo", Algorithm(
    name="mgrpo", title="M-GRPO", play="delegate", estimator="mgrpo", grouping="naive",
    max_turns=longest_agent, asynchronous=True, kl_in_reward=True,
    description="planner + sub-agents, per-agent groups with alignment"))
register_algorithm("at_grpo", Algorithm(
    name="at_grpo", title="AT-GRPO", play="tree", estimator="at_grpo", grouping="agent_turn",
    max_turns=one_turn, asynchronous=False, kl_in_reward=False,
    description="tree sampling, groups (query, agent, turn)"))
register_algorithm("grpo", Algorithm(
    name="grpo", title="GRPO", play="inline", estimator="grpo", grouping="naive",
    max_turns=planner_with_inline_calls, asynchronous=True, kl_in_reward=True,
    description="single agent, the planner calls the tools itself"))
