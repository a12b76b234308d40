"""What the built-in worlds share: the agent protocol's markers in their actions, and the
kit's readers and hashed splits."""

from __future__ import annotations

import pytest

from mgrpo import protocol_tokens as T
from mgrpo.envs.worlds import build_world, world_names
from mgrpo.envs.worlds.kit import code_of, split_of, tagged


@pytest.mark.parametrize("name", ["sokoban", "coder_tester", "math_team"])
def test_each_role_stops_at_a_protocol_marker_and_the_expert_writes_it(name):
    world = build_world(name, max_turns=2)
    assert name in world_names() and world.max_turns == 2
    assert set(world.stops) == set(world.roles)
    state = world.reset(world.tasks("dev", 1, seed=0)[0])
    for role in world.roles:
        action = world.expert_action(state, role)
        (stop,) = world.stops[role]
        assert stop in (T.TOOL_CLOSE, T.ANSWER_CLOSE) and action.endswith(stop)
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        build_world(name, max_turns=0)


def test_tagged_reads_the_last_pair_or_an_unclosed_tail():
    assert tagged("<answer>a</answer> <answer> b </answer>", "answer") == "b"
    assert tagged("x <ANSWER>c", "answer") == "c" and tagged("none", "answer") is None


def test_code_of_reads_the_tool_marker_fences_or_the_bare_text():
    assert code_of("<tool>```python\nprint(1)\n```</tool>") == "print(1)"
    assert code_of("see:\n```py\nx = 1\n```\nok") == "x = 1"
    assert code_of("<code>y = 2</code>") == "y = 2" and code_of(" z = 3 ") == "z = 3"


def test_splits_are_spread_as_declared():
    counts = {"train": 0, "dev": 0, "test": 0}
    for i in range(4000):
        counts[split_of(f"key-{i}")] += 1
    assert 0.77 < counts["train"] / 4000 < 0.83 and 0.08 < counts["test"] / 4000 < 0.12


def test_tasks_are_byte_identical_in_another_process_with_another_hash_seed():
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    script = ("import dataclasses, json\nfrom mgrpo.envs.worlds import build_world\n"
              "print(json.dumps({n: [dataclasses.asdict(t) for s in ('train', 'test')\n"
              "    for t in build_world(n).tasks(s, 8, 7)]\n"
              "    for n in ('sokoban', 'coder_tester', 'math_team')}, sort_keys=True))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    here = json.dumps({n: [dataclasses.asdict(t) for s in ("train", "test")
                           for t in build_world(n).tasks(s, 8, 7)]
                       for n in ("sokoban", "coder_tester", "math_team")}, sort_keys=True)
    assert out == here
