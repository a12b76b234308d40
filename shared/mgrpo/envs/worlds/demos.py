"""Warm-start demonstrations from a world's scripted expert: every turn of an expert episode
as one SFT example ``{"agent": role, "segments": [observation (not trained), action
(trained)]}``, the JSONL that ``mgrpo sft --data`` reads (``mgrpo.models.sft``). A turn-team
sample is the same two parts (its observation, then its action), so a model warm-started on
these sees the prompts it is trained on with ``workflow: {kind: turn_team}``.

What this module does not do: train (``mgrpo sft``).
"""

from __future__ import annotations

import json
from pathlib import Path

from mgrpo.envs.worlds.base import World
from mgrpo.envs.worlds.play import play


def expert_demos(world: World, split: str, n: int, seed: int,
                 solved_only: bool = True) -> list[dict]:
    """SFT examples of the expert's turns on ``n`` tasks of ``split`` (with
    ``solved_only``, only the episodes it solved)."""
    out = []
    for task in world.tasks(split, n, seed):
        state = play(world, task, world.expert_action)
        if solved_only and world.score(state) < 1.0:
            continue
        out += [{"agent": turn.role, "segments": [{"text": turn.observation, "train": False},
                                                   {"text": turn.action, "train": True}]}
                for turn in state.turns]
    return out


def write_demos(examples: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    return path
