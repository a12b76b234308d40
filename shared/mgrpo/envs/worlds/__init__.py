"""Turn-based worlds (AT-GRPO's settings): :mod:`mgrpo.envs.worlds.base` holds the protocol
and the registry; each world is one module here and registers itself on import."""

from mgrpo.envs.worlds import (  # noqa: F401 - each registers its world
    coder_tester,
    math_team,
    plan_path,
    sokoban,
    solo,
    sudoku4,
)
from mgrpo.envs.worlds.base import (
    SPLITS,
    WORLDS,
    Turn,
    World,
    WorldState,
    WorldTask,
    build_world,
    get_world,
    register_world,
    world_names,
)

__all__ = ["SPLITS", "WORLDS", "Turn", "World", "WorldState", "WorldTask", "build_world",
           "get_world", "register_world", "world_names"]
