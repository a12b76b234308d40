"""The algorithm registry: every algorithm is one object both modes read; names are checked."""

from __future__ import annotations

import pytest

from mgrpo.algo.algorithms import (
    Algorithm,
    algorithm_names,
    get_algorithm,
    one_tree,
    one_turn,
    register_algorithm,
)
from mgrpo.algo.estimators import estimator_names


def test_registered_algorithms_and_their_fields():
    assert algorithm_names() == ["at_grpo", "grpo", "mgrpo"]
    mgrpo, at_grpo, grpo = (get_algorithm(n) for n in ("mgrpo", "at_grpo", "grpo"))
    assert (mgrpo.play, mgrpo.sub_agents, mgrpo.asynchronous) == ("episodes", "agents", True)
    assert (at_grpo.play, at_grpo.sub_agents, at_grpo.asynchronous) == ("tree", "agents", False)
    assert (grpo.play, grpo.sub_agents, grpo.asynchronous) == ("episodes", "inline", True)
    for name in algorithm_names():  # each groups its samples with a registered estimator
        assert get_algorithm(name).estimator in estimator_names()
    assert (mgrpo.grouping, at_grpo.grouping, grpo.grouping) == ("naive", "agent_turn", "naive")


def test_max_turns_per_sample():
    """Dr. GRPO's L per algorithm, with 3 planner turns and 2 sub-agent turns."""
    assert get_algorithm("mgrpo").max_turns(3, 2) == 3  # the longer agent's trajectory
    assert get_algorithm("grpo").max_turns(3, 2) == 3 * (1 + 2)  # inline calls in context
    assert get_algorithm("at_grpo").max_turns(3, 2) == 1  # a sample is one turn


def test_tasks_per_query_and_who_plays_the_sub_agents():
    """A tree is one task per query; an inline algorithm's planner plays every sub-agent."""
    roles = ["planner", "searcher", "coder"]
    assert [get_algorithm(n).tasks_per_query(4) for n in ("mgrpo", "at_grpo", "grpo")] == \
        [4, 1, 4]
    assert get_algorithm("mgrpo").agent_roles(roles) == ["searcher", "coder"]
    assert get_algorithm("at_grpo").agent_roles(roles) == ["searcher", "coder"]
    assert get_algorithm("grpo").agent_roles(roles) == []
    assert get_algorithm("grpo").inline_roles(roles) == ["searcher", "coder"]
    assert get_algorithm("mgrpo").inline_roles(roles) == []


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown algorithm 'ppo'; valid: at_grpo, grpo, "
                                         r"mgrpo \(one of your own: register_algorithm"):
        get_algorithm("ppo")


def test_a_second_algorithm_of_a_name_is_refused():
    register_algorithm("mgrpo", get_algorithm("mgrpo"))  # the same object again: fine
    clash = Algorithm(name="mgrpo", title="X", description="", play="tree",
                      sub_agents="agents", tasks_per_query=one_tree, estimator="grpo",
                      grouping="naive", max_turns=one_turn, asynchronous=False,
                      kl_in_reward=False, markup_only=True, nests=False,
                      workflows=("hierarchy",))
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("mgrpo", clash)
    assert get_algorithm("mgrpo").play == "episodes"


def test_no_module_compares_algorithm_names():
    """Both modes read the registered object (``cfg.algo``); an ``x.algorithm == "..."`` or
    ``x.algorithm in (...)`` anywhere in the library or the shells is a chain to replace."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    found = []
    for path in [*(root / "shared" / "mgrpo").rglob("*.py"), *(root / "services").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "algorithm"
                    for side in [node.left, *node.comparators]):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"compare cfg.algo's fields instead: {found}"
