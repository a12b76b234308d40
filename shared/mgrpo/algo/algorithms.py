"""The training algorithms, registered by name: ``mgrpo``, ``at_grpo``, ``grpo``.

An algorithm is one small object: how its rounds are played, which registered estimator
groups and scores its samples, how many turns a sample spans, and which options it allows.
Both modes (embedded and the services) look it up here (``register_algorithm`` /
``get_algorithm`` / ``algorithm_names``, the one registry form of ``mgrpo.registry``) and read
its fields; no code outside this module compares algorithm names.

| name    | play     | sub_agents | groups (estimator)              | max_turns  | async | KL rew. |
| ------- | -------- | ---------- | ------------------------------- | ---------- | ----- | ------- |
| mgrpo   | episodes | agents     | planner: query; sub-agent:      | longest    | yes   | yes     |
|         |          |            | query, aligned to d (``mgrpo``) | agent's    |       |         |
| at_grpo | tree     | agents     | (query, agent, turn)            | 1          | no    | no      |
|         |          |            | (``at_grpo``)                   |            |       |         |
| grpo    | episodes | inline     | query (``grpo``)                | planner's  | yes   | yes     |
|         |          |            |                                 | + inline   |       |         |

``play`` names how a round is played, the round player registered under that name on the
training side (``mgrpo.training.hierarchy_run.ROUND_PLAYS``): ``episodes`` - k episodes per
query; ``tree`` - AT-GRPO's tree sampling: one tree per query, K candidates per turn, the best
one continues (``tasks_per_query``: 1). ``sub_agents`` says who plays the sub-agent roles:
``agents`` - each is its own agent (a local pool embedded, a ``serve subagent`` worker each
distributed; :meth:`Algorithm.agent_roles`); ``inline`` - the planner plays every role in its
own context and calls the tools itself (no sub-agent services; :meth:`Algorithm.inline_roles`).
The remaining fields say which options and workflows an algorithm takes; the run config
checks them in one place (``RunConfig._check_algorithm``).

What this module does NOT do: play episodes, compute advantages (``mgrpo.algo.estimators``)
or validate a run config (``mgrpo.training.config`` asks :func:`get_algorithm`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mgrpo.registry import Registry

Play = Literal["episodes", "tree"]  # the round player's name (training: ROUND_PLAYS)
SubAgents = Literal["agents", "inline"]  # who plays the sub-agent roles
MaxTurns = Callable[[int, int], int]  # (planner_max_turns, subagent_max_turns) -> turns
TasksPerQuery = Callable[[int], int]  # k -> a training round's tasks per query


def longest_agent(planner_max_turns: int, subagent_max_turns: int) -> int:
    """A sample is one agent's trajectory: the longer agent's turn limit."""
    return max(planner_max_turns, subagent_max_turns)


def planner_with_inline_calls(planner_max_turns: int, subagent_max_turns: int) -> int:
    """A sample is the planner's trajectory with every call's turns played inline."""
    return planner_max_turns * (1 + subagent_max_turns)


def one_turn(planner_max_turns: int, subagent_max_turns: int) -> int:
    """A sample is one turn's action."""
    return 1


def one_per_rollout(k: int) -> int:
    """Each of a query's k rollouts is its own episode task."""
    return k


def one_tree(k: int) -> int:
    """A query is one tree task whose K candidate slots are its rollouts."""
    return 1


@dataclass(frozen=True)
class Algorithm:
    """One training algorithm: how its rounds are played (``play``, ``tasks_per_query``), who
    plays the sub-agent roles (``sub_agents``), the registered advantage estimator that scores
    its samples (``estimator``, ``mgrpo.algo.estimators``) and that estimator's default groups
    (``grouping``, ``GROUPINGS``), the most turns one trained sample spans (``max_turns``:
    Dr. GRPO's L), and which options and workflows it takes."""

    name: str
    title: str  # as the papers write it
    description: str
    play: Play
    sub_agents: SubAgents
    tasks_per_query: TasksPerQuery
    estimator: str
    grouping: str  # which of (query, agent, turn) key a group (workflow.grouping overrides)
    max_turns: MaxTurns
    asynchronous: bool  # may sample round n+1 while round n trains (max_staleness > 0)
    kl_in_reward: bool  # takes loss.kl_in_reward (a KL penalty on each trajectory's reward)
    markup_only: bool  # renders protocol.format markup only
    nests: bool  # trains nested delegation (a sub-agent that calls others)
    workflows: tuple[str, ...]  # the workflow kinds it trains

    def agent_roles(self, roles) -> list[str]:
        """The sub-agent roles of ``roles`` that are agents of their own (a local pool
        embedded, a worker each distributed); none when the planner plays them inline."""
        return [r for r in roles if r != "planner" and self.sub_agents == "agents"]

    def inline_roles(self, roles) -> list[str]:
        """The sub-agent roles of ``roles`` the planner plays itself, in its own context,
        calling their tools; none when each is an agent of its own."""
        return [r for r in roles if r != "planner" and self.sub_agents == "inline"]


ALGORITHMS: Registry[Algorithm] = Registry(
    "algorithm", hint="one of your own: register_algorithm(name, Algorithm(...)) in a module "
    "named under `plugins:`")
register_algorithm = ALGORITHMS.register
get_algorithm = ALGORITHMS.get
algorithm_names = ALGORITHMS.names


register_algorithm("mgrpo", Algorithm(
    name="mgrpo", title="M-GRPO", play="episodes", sub_agents="agents",
    tasks_per_query=one_per_rollout, estimator="mgrpo", grouping="naive",
    max_turns=longest_agent, asynchronous=True, kl_in_reward=True, markup_only=False,
    nests=True, workflows=("hierarchy",),
    description="planner + sub-agents, per-agent groups with alignment"))
register_algorithm("at_grpo", Algorithm(
    name="at_grpo", title="AT-GRPO", play="tree", sub_agents="agents",
    tasks_per_query=one_tree, estimator="at_grpo", grouping="agent_turn",
    max_turns=one_turn, asynchronous=False, kl_in_reward=False, markup_only=True,
    nests=False, workflows=("hierarchy", "turn_team"),
    description="tree sampling, groups (query, agent, turn)"))
register_algorithm("grpo", Algorithm(
    name="grpo", title="GRPO", play="episodes", sub_agents="inline",
    tasks_per_query=one_per_rollout, estimator="grpo", grouping="naive",
    max_turns=planner_with_inline_calls, asynchronous=True, kl_in_reward=True,
    markup_only=True, nests=False, workflows=("hierarchy",),
    description="single agent, the planner calls the tools itself"))
