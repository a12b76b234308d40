"""A trainer service warns, as the embedded loop does, when its model's groups have had zero
reward variance for 3 rounds: one watch per run, over the trainer's own roles only."""

from __future__ import annotations

from types import SimpleNamespace

from mgrpo.services.trainer.round_training import RoundTraining


def _rounds(frozen: bool = False) -> RoundTraining:
    """A trainer's rounds over its roles; the watch needs no store, bus or weights."""
    return RoundTraining(settings=None, cfg=None, store=None, bus=None,
                         lm=SimpleNamespace(name="shared"), roles=["searcher", "coder"],
                         frozen=frozen, weights=None)


def test_a_trainer_watches_its_roles_per_run():
    trainer = _rounds()
    flat = {"searcher/frac_reward_zero_std": 1.0, "coder/frac_reward_zero_std": 0.5,
            "planner/frac_reward_zero_std": 1.0, "shared/grad_norm": 0.2}
    said = [trainer.watch("a").check(r, flat) for r in range(3)]
    assert [len(s) for s in said] == [0, 0, 1]
    assert said[2][0].startswith("warning: searcher: every group had the same reward")
    assert trainer.watch("b").check(0, flat) == []  # another run counts on its own
    assert trainer.watch("a") is trainer.watch("a")
    frozen = _rounds(frozen=True)
    assert [frozen.watch("a").check(r, flat) for r in range(3)] == [[], [], []]

