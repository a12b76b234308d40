"""Play a world's episode with any policy (a function of the state and the role), and the
scripted expert's solve rate over a split.

What this module does not do: sample from a model or keep trajectories for training (the
workflows and the training round do).
"""

from __future__ import annotations

from collections.abc import Callable

from mgrpo.envs.worlds.base import World, WorldState, WorldTask

Policy = Callable[[WorldState, str], str]


def play(world: World, task: WorldTask, policy: Policy) -> WorldState:
    """One episode: every role acts in turn order until the world says it is done."""
    state = world.reset(task)
    for _ in range(world.max_turns):
        for role in world.roles:
            if state.done:
                return state
            world.act(state, role, policy(state, role))
    return state


def expert_report(world: World, split: str, n: int, seed: int) -> dict:
    """The scripted expert on ``n`` tasks of ``split``: solved fraction (team reward 1.0),
    mean team reward and mean team turns."""
    states = [play(world, task, world.expert_action) for task in world.tasks(split, n, seed)]
    scores = [world.score(s) for s in states]
    return {"world": world.name, "split": split, "n": len(states), "seed": seed,
            "solved": round(sum(s == 1.0 for s in scores) / max(len(states), 1), 4),
            "mean_team_reward": round(sum(scores) / max(len(states), 1), 4),
            "mean_team_turns": round(sum(s.team_turn for s in states) / max(len(states), 1), 3)}
