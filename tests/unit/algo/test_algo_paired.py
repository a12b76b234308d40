"""The paired bootstrap interval (mgrpo.algo.paired) against hand-computed values."""

from __future__ import annotations

import pytest

from mgrpo.algo.paired import paired_bootstrap, seed_task_bootstrap


def test_one_run_each_is_the_paired_bootstrap_over_questions():
    # per-question differences (0, 0, 0, 1): mean 0.25. A resample of 4 differences has
    # k ~ Binomial(4, 1/4) ones, mean k/4: P(k=0) = 0.316 > 0.025, so the 2.5% quantile is 0;
    # P(k <= 2) = 0.949 < 0.975 <= P(k <= 3) = 0.996, so the 97.5% quantile is 3/4.
    res = paired_bootstrap([1, 1, 1, 1], [1, 1, 1, 0])
    assert res.diff == 0.25 and (res.low, res.high) == (0.0, 0.75)
    assert res.questions == 4 and res.runs == (1, 1) and not res.significant


def test_identical_and_opposite_arms():
    same = paired_bootstrap([[1, 0, 1], [0, 0, 1]], [[1, 0, 1], [0, 0, 1]])
    assert same.diff == 0.0 and not same.significant  # runs are drawn per arm: not (0, 0)
    best = paired_bootstrap([1] * 5, [0] * 5)
    assert (best.diff, best.low, best.high) == (1.0, 1.0, 1.0) and best.significant


def test_pairing_cancels_question_difficulty():
    # Half the questions are easy (both right), half hard (both wrong), and A gets one more
    # hard question right. Paired, only that difference varies: k ~ Binomial(20, 1/20)
    # draws of it, mean k/20. P(k=0) = 0.358, so the 2.5% quantile is 0; P(k <= 2) = 0.925
    # < 0.975 <= P(k <= 3) = 0.984, so the 97.5% quantile is 3/20. (Unpaired, the 50/50
    # easy/hard split would add +-0.2 or so of noise to each arm's mean.)
    a = [1] * 10 + [0] * 9 + [1]
    b = [1] * 10 + [0] * 10
    res = paired_bootstrap(a, b)
    assert res.diff == pytest.approx(0.05) and res.low == 0.0
    assert res.high == pytest.approx(0.15)


def test_seed_spread_counts():
    # A's two runs disagree completely, B is 0.5 everywhere. A draw of A's runs gives a mean
    # of 1 (both draws run 0, p = 1/4), 0 (p = 1/4) or 0.5 (p = 1/2); questions do not
    # matter. So the difference is 0.5, -0.5 or 0: the 95% interval is [-0.5, 0.5].
    res = paired_bootstrap([[1, 1, 1, 1], [0, 0, 0, 0]], [[0.5] * 4])
    assert res.diff == 0.0 and (res.low, res.high) == (-0.5, 0.5)


def test_refuses_unpaired_inputs():
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap([1], [0], level=1.0)


def test_seed_task_bootstrap_resamples_seeds():
    # Seed 0's tasks all differ by 0.1, seed 1's by 0.3: tasks do not matter. A draw of two
    # seeds is (0, 0) (p 1/4, mean 0.1), mixed (p 1/2, 0.2) or (1, 1) (p 1/4, 0.3).
    res = seed_task_bootstrap([[0.6, 0.6, 0.6], [0.8, 0.8]], [[0.5, 0.5, 0.5], [0.5, 0.5]])
    assert res.diff == pytest.approx(0.2) and res.runs == (2, 2) and res.questions == 5
    assert (res.low, res.high) == (pytest.approx(0.1), pytest.approx(0.3))


def test_seed_task_bootstrap_with_one_seed_is_the_paired_bootstrap_over_tasks():
    # as test_one_run_each_is_the_paired_bootstrap_over_questions: quantiles 0 and 3/4
    res = seed_task_bootstrap([[1, 1, 1, 1]], [[1, 1, 1, 0]])
    assert res.diff == 0.25 and (res.low, res.high) == (0.0, 0.75) and res.runs == (1, 1)


def test_seed_task_bootstrap_is_wider_than_pooling_the_pairs_when_seeds_disagree():
    # Three seeds that disagree (differences +0.2, 0, -0.1 on 200 tasks each): pooling the
    # 600 (seed, task) pairs as one run leaves the seed spread out.
    a = [[1] * 40 + [0] * 160, [1] * 30 + [0] * 170, [1] * 20 + [0] * 180]
    b = [[0] * 200, [1] * 30 + [0] * 170, [1] * 40 + [0] * 160]
    seeded = seed_task_bootstrap(a, b)
    pooled = paired_bootstrap([x for row in a for x in row], [x for row in b for x in row])
    assert seeded.diff == pytest.approx(pooled.diff)
    assert seeded.high - seeded.low > 1.5 * (pooled.high - pooled.low)


def test_seed_task_bootstrap_refuses_unpaired_seeds():
    with pytest.raises(ValueError, match="same seeds"):
        seed_task_bootstrap([[1, 0]], [[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="seed 0"):
        seed_task_bootstrap([[1, 0]], [[1]])
