"""The KL-in-reward coefficient controller (mgrpo.algo.kl_control) against hand-computed
values of Ziegler et al.'s adaptive rule."""

from __future__ import annotations

import pytest

from mgrpo.algo.kl_control import KL_CONTROLS, next_kl_coef


@pytest.mark.parametrize(("coef", "kl", "n", "target", "horizon", "expected"), [
    # e = 8/6 - 1 = 1/3 -> clipped to 0.2; 0.1 * (1 + 0.2 * 512 / 10000) = 0.1 * 1.01024
    (0.1, 8.0, 512, 6.0, 10000, 0.101024),
    # e = 5.4/6 - 1 = -0.1 (inside the clip); 0.2 * (1 - 0.1 * 100 / 1000) = 0.198
    (0.2, 5.4, 100, 6.0, 1000, 0.198),
    # e = 0/2 - 1 = -1 -> -0.2; 0.05 * (1 - 0.2 * 64 / 64) = 0.04
    (0.05, 0.0, 64, 2.0, 64, 0.04),
    # on target: unchanged
    (0.3, 6.0, 1000, 6.0, 10, 0.3),
])
def test_adaptive_matches_the_hand_computed_step(coef, kl, n, target, horizon, expected):
    assert next_kl_coef("adaptive", coef, kl, n, target, horizon) == pytest.approx(
        expected, rel=1e-12)


def test_repeated_steps_compound_and_fixed_never_moves():
    coef = 0.1
    for kl in (12.0, 12.0, 3.0):  # +0.2, +0.2, then e = 3/4 - 1 = -0.25 -> -0.2; n/h = 0.5
        coef = next_kl_coef("adaptive", coef, kl, 50, 4.0, 100)
    assert coef == pytest.approx(0.1 * 1.1 * 1.1 * 0.9, rel=1e-12)
    assert next_kl_coef("fixed", 0.1, 100.0, 50, 4.0, 100) == 0.1
    assert next_kl_coef("adaptive", 0.1, 100.0, 0, 4.0, 100) == 0.1  # no sequences
    assert KL_CONTROLS == ("fixed", "adaptive")


@pytest.mark.parametrize(("args", "message"), [
    (("adaptive", 0.1, 1.0, 4, None, 10), "target KL > 0"),
    (("adaptive", 0.1, 1.0, 4, 2.0, 0), "horizon >= 1"),
    (("pid", 0.1, 1.0, 4, 2.0, 10), "unknown KL control 'pid'"),
])
def test_bad_settings_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        next_kl_coef(*args)
