"""Turn-based worlds: a team of roles takes turns on one task (AT-GRPO's settings: games and
planning with a tool agent and a plan agent, coding with a coder and a tester, math with a
reasoner and a tool-user).

A :class:`World` is text in, text out. It makes seeded tasks per split, shows each role its own
observation (the statement, its history and what the other roles produced), applies a role's
action (running code in the sandbox where the world has a tool), gives each action a local
reward, says when an episode ends, and scores the team's result with its verifier. A scripted
expert gives one action per (state, role) for warm-start demonstrations.

Worlds are registered by name (:func:`register_world`); a user's world is registered from their
own package (``plugins:``) the same way.

What this module does NOT do: sample from models, group samples or train (``workflows``,
``training``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mgrpo.registry import Registry

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class WorldTask:
    """One task of a world. ``data`` and ``solution`` are JSON-able and world-specific."""

    task_id: str
    split: str
    statement: str  # what every role is shown first
    solution: Any  # the verifier's reference (a path, a solved grid, hidden tests, a number)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One action of one role: what it was shown, what it did, its local reward."""

    index: int  # the team turn (every role acts once per team turn, in ``World.roles`` order)
    role: str
    observation: str
    action: str
    reward: float
    feedback: str = ""  # what the world answered (a tool's output, a test report)
    malformed: bool = False  # the world could read no action of the role's form in it


class Malformed(str):
    """The feedback of a malformed action (no action of the role's form could be read: no
    tagged answer, no code, no expression the tool can compute, no tests): a world's
    ``act`` records the turn with ``malformed=True``."""


@dataclass
class WorldState:
    """An episode in progress. ``data`` is the world's mutable state (JSON-able)."""

    task: WorldTask
    turns: list[Turn] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    @property
    def team_turn(self) -> int:
        """The team turn the next action belongs to."""
        return self.data.get("team_turn", 0)


@runtime_checkable
class World(Protocol):
    """A world may also set ``stops: dict[role, tuple[str, ...]]``: the markers a role's
    generated turn ends at (``mgrpo.training.team_play``; default: every closing marker of
    the agent protocol)."""

    name: str
    roles: tuple[str, ...]  # in turn order
    max_turns: int  # team turns; the episode ends at this many or when ``state.done``

    def tasks(self, split: str, n: int, seed: int) -> list[WorldTask]:
        """``n`` tasks of ``split``, the same for the same seed; splits are disjoint."""

    def reset(self, task: WorldTask) -> WorldState:
        """A fresh episode on ``task``."""

    def observe(self, state: WorldState, role: str) -> str:
        """The prompt ``role`` acts on now."""

    def act(self, state: WorldState, role: str, action: str) -> Turn:
        """Apply ``role``'s ``action``: append and return its :class:`Turn` (with its local
        reward), advance the team turn after the last role, set ``state.done`` when solved or
        out of turns. A malformed action is a turn with a low reward, never an exception."""

    def score(self, state: WorldState) -> float:
        """The team reward in [0, 1]: the verifier's verdict on the episode (1.0 solved)."""

    def expert_action(self, state: WorldState, role: str) -> str:
        """The scripted expert's action for ``role`` now (a warm-start demonstration)."""


WorldFactory = Callable[..., World]
WORLDS: Registry[WorldFactory] = Registry(
    "world", hint="a world of your own: register_world in a module named under `plugins:`")
register_world = WORLDS.register  # decorator, or register_world(name, factory)
get_world = WORLDS.get
world_names = WORLDS.names


def build_world(name: str, **options: Any) -> World:
    """The world registered as ``name`` (a class or function taking keyword options, e.g.
    ``sandbox=``), built with ``options``; an unknown name lists the valid ones."""
    return get_world(name)(**options)
