"""Warnings that save a run (``mgrpo.training.watch``): each sign of a run that learns
nothing is one line with the number and what to try, once per streak. Before, a run on the
user's own data had every group at zero reward variance and grad_norm 0 for every round,
visible only on the dashboard."""

from __future__ import annotations

from mgrpo.training.watch import RunWatch

AGENTS = {"planner": "planner", "searcher": "searcher", "coder": "coder"}


def _watch(**kwargs) -> RunWatch:
    return RunWatch(AGENTS, ["planner", "searcher", "coder"], **kwargs)


def test_zero_variance_warned_once_after_patience_rounds():
    watch = _watch(patience=3)
    flat = {"planner/frac_reward_zero_std": 1.0, "planner/reward_mean": 0.0,
            "planner/grad_norm": 0.0}
    said = [watch.check(r, flat) for r in range(5)]
    assert [len(s) for s in said] == [0, 0, 1, 0, 0]
    line = said[2][0]
    assert line.startswith("warning: planner: every group had the same reward for 3 rounds")
    assert "planner/frac_reward_zero_std=1" in line and "larger k" in line
    # grad_norm 0 is explained by the zero variance: not a second line
    assert watch.check(5, {**flat, "planner/frac_reward_zero_std": 0.5}) == []
    # a new streak warns again
    assert [len(watch.check(r, flat)) for r in range(6, 9)] == [0, 0, 1]


def test_zero_grad_norm_with_reward_variance():
    watch = _watch(patience=2)
    metrics = {"planner/frac_reward_zero_std": 0.25, "planner/grad_norm": 0.0,
               "searcher/frac_reward_zero_std": 0.5, "searcher/grad_norm": 0.3}
    assert watch.check(0, metrics) == []
    (line,) = watch.check(1, metrics)
    assert line.startswith("warning: model planner: planner/grad_norm=0 for 2 rounds")


def test_format_valid_collapse():
    watch = _watch()
    assert watch.check(0, {"planner/format_valid": 0.9}) == []
    assert watch.check(1, {"planner/format_valid": 0.5}) == []  # above half the best
    (line,) = watch.check(2, {"planner/format_valid": 0.3})
    assert line == ("warning: planner/format_valid=0.3 in round 3, down from 0.9 in round 1: "
                    "the planner is losing the answer format, so its reward falls to 0. Try "
                    "a lower models.<planner>.lr, loss.kl_coef > 0 (a KL to the warm start), "
                    "or a larger format weight (rewards.planner)")
    assert watch.check(3, {"planner/format_valid": 0.2}) == []  # same collapse
    assert watch.check(4, {"planner/format_valid": 0.8}) == []  # recovered
    assert len(watch.check(5, {"planner/format_valid": 0.1})) == 1
    # a model that never had the format is not a collapse
    low = _watch()
    assert low.check(0, {"planner/format_valid": 0.1}) == []
    assert low.check(1, {"planner/format_valid": 0.0}) == []


def test_subagent_never_called():
    watch = _watch(patience=2)
    metrics = {"searcher/calls_per_episode": 0.0, "coder/calls_per_episode": 1.5}
    assert watch.check(0, metrics) == []
    (line,) = watch.check(1, metrics)
    assert line.startswith("warning: searcher was not called in 2 rounds "
                           "(searcher/calls_per_episode=0)")
    frozen = RunWatch(AGENTS, ["planner"], patience=1)  # a frozen sub-agent learns nothing anyway
    assert frozen.check(0, metrics) == []


def test_calls_are_expected_only_from_roles_the_questions_need():
    from types import SimpleNamespace

    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import expected_roles

    cfg = RunConfig.model_validate({"models": {m: {"path": "x"} for m in AGENTS}})
    lookup = SimpleNamespace(subtasks=[SimpleNamespace(agent="searcher")])
    assert expected_roles(cfg, [lookup]) == {"searcher"}  # a stage-1 round needs no coder
    assert expected_roles(cfg, [SimpleNamespace(subtasks=[])]) == {"searcher", "coder"}


def test_each_warning_fires_on_its_sign_and_not_without_it():
    """Every RunWatch line on one round that shows its sign, and none on the same round
    without it (patience 1: each round decides)."""
    signs = {
        "every group had the same reward": ({"planner/frac_reward_zero_std": 1.0},
                                            {"planner/frac_reward_zero_std": 0.5}),
        "planner/grad_norm=0": ({"planner/frac_reward_zero_std": 0.5, "planner/grad_norm": 0.0},
                                {"planner/frac_reward_zero_std": 0.5, "planner/grad_norm": 0.1}),
        "was not called": ({"searcher/calls_per_episode": 0.0},
                           {"searcher/calls_per_episode": 0.5}),
    }
    for phrase, (fires, quiet) in signs.items():
        said = _watch(patience=1).check(0, fires)
        assert len(said) == 1 and phrase in said[0], (phrase, said)
        assert _watch(patience=1).check(0, quiet) == [], phrase
    watch = _watch(patience=1)
    assert watch.check(0, {"planner/format_valid": 0.8}) == []
    assert watch.check(1, {"planner/format_valid": 0.7}) == []  # no collapse: quiet
    (line,) = watch.check(2, {"planner/format_valid": 0.3})
    assert "losing the answer format" in line


def test_zero_grad_norm_of_a_shared_model_whose_other_role_had_no_samples():
    """A model shared by two roles: one role's groups all had equal rewards, the other had no
    samples at all (no groups, so no frac_reward_zero_std). No group had variance, so
    grad_norm=0 is expected, not a warning; with variance in the first role it is one."""
    shared = RunWatch({"planner": "m", "searcher": "m"}, ["m"], patience=1)
    quiet = {"planner/frac_reward_zero_std": 1.0, "m/grad_norm": 0.0}
    said = shared.check(0, quiet)
    assert not any("grad_norm" in line for line in said), said
    loud = RunWatch({"planner": "m", "searcher": "m"}, ["m"], patience=1)
    (line,) = loud.check(0, {"planner/frac_reward_zero_std": 0.5, "m/grad_norm": 0.0})
    assert "model m: m/grad_norm=0" in line
