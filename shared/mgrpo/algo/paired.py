"""Paired comparison of two trained systems on the same held-out questions.

Two arms A and B are each trained with several RL seeds (runs) and evaluated on the same
questions. ``a[s][i]`` is run s of arm A's score on question i (1 correct, 0 not). The
statistic is the difference of the arms' mean accuracies, mean(A) - mean(B). Its interval
comes from a two-level percentile bootstrap. Each draw resamples the questions with
replacement, with the same draw for both arms (paired: question difficulty cancels). Each
draw also resamples each arm's runs with replacement, so seed-to-seed spread counts. With one
run per arm this is the ordinary paired bootstrap over per-question differences.

:func:`seed_task_bootstrap` is the two-stage bootstrap for arms whose seed s plays its own
questions (the turn teams: each seed's held-out tasks are drawn from that seed), the same
for both arms at that seed: each draw resamples the seeds with replacement, then within each
drawn seed its questions with replacement, paired across the arms. Seed-to-seed spread
counts through the first stage; with few seeds (3 seeds allow 10 distinct seed draws) the
first stage is coarse and the interval can be narrower than a Student-t interval over the
seeds' differences.

Pure numpy; no I/O. ``mgrpo ablate`` prints it per pair of variants in its results.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedInterval:
    diff: float      # mean(A) - mean(B) on the observed runs and questions
    low: float       # percentile bootstrap interval at ``level``
    high: float
    level: float
    questions: int
    runs: tuple[int, int]  # runs (seeds) of A and of B

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return self.low > 0 or self.high < 0


def _matrix(x: Sequence[Sequence[float]], name: str) -> np.ndarray:
    m = np.asarray(x, dtype=np.float64)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ValueError(f"{name}: expected runs x questions scores, got shape {m.shape}")
    return m


def _run_weights(draws: np.ndarray, runs: int) -> np.ndarray:
    """(n_boot, runs) share of each run in each draw of ``runs`` runs."""
    weights = np.zeros((draws.shape[0], runs))
    np.add.at(weights, (np.arange(draws.shape[0])[:, None], draws), 1.0)
    return weights / runs


def paired_bootstrap(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]],
                     n_boot: int = 10000, level: float = 0.95, seed: int = 0
                     ) -> PairedInterval:
    """Interval of mean(A) - mean(B): runs x questions score matrices with the same
    questions in the same column order (a 1-D sequence is one run)."""
    ma, mb = _matrix(a, "a"), _matrix(b, "b")
    if ma.shape[1] != mb.shape[1]:
        raise ValueError(f"a has {ma.shape[1]} questions and b {mb.shape[1]}: a paired "
                         "comparison needs the same questions in both")
    if not 0 < level < 1 or n_boot < 1:
        raise ValueError(f"level={level} must be in (0, 1) and n_boot={n_boot} >= 1")
    rng = np.random.default_rng(seed)
    n_q = ma.shape[1]
    q = rng.integers(0, n_q, size=(n_boot, n_q))
    ra = rng.integers(0, ma.shape[0], size=(n_boot, ma.shape[0]))
    rb = rng.integers(0, mb.shape[0], size=(n_boot, mb.shape[0]))
    # Per draw: each arm's mean over its drawn runs of the per-question scores at the drawn
    # questions. Averaging runs first (the run draw is independent of the question draw) is
    # the same number: run weights (how often each run was drawn) times the score matrix.
    pa = _run_weights(ra, ma.shape[0]) @ ma  # (n_boot, n_q)
    pb = _run_weights(rb, mb.shape[0]) @ mb
    stats = (np.take_along_axis(pa, q, axis=1) - np.take_along_axis(pb, q, axis=1)).mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(stats, [tail, 1 - tail], method="inverted_cdf")
    return PairedInterval(diff=float(ma.mean() - mb.mean()), low=float(low), high=float(high),
                          level=level, questions=n_q, runs=(ma.shape[0], mb.shape[0]))


def seed_task_bootstrap(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]],
                        n_boot: int = 10000, level: float = 0.95, seed: int = 0
                        ) -> PairedInterval:
    """Interval of mean(A) - mean(B), resampling seeds, then each drawn seed's questions.

    ``a[s]``, ``b[s]``: (Q_s,) scores of the two arms' runs of seed s on that seed's Q_s
    questions, in the same order (paired within a seed; Q_s may differ between seeds).
    Statistic: ``D = (1/S) sum_s mean_i (a[s][i] - b[s][i])``, the mean over seeds of each
    seed's paired difference. Draw: seeds ``s_1..s_S`` uniformly with replacement; for each
    slot j independently, ``Q_{s_j}`` questions of seed ``s_j`` with replacement; the draw's
    statistic is the mean over the slots of the mean difference on the drawn questions.
    ``runs`` of the result: (S, S), the seeds the interval rests on; ``questions``: the sum
    of Q_s (the (seed, question) pairs).
    """
    if len(a) != len(b) or not len(a):
        raise ValueError(f"a has {len(a)} seeds and b {len(b)}: a seed-paired comparison "
                         "needs the same seeds (at least one) in both")
    if not 0 < level < 1 or n_boot < 1:
        raise ValueError(f"level={level} must be in (0, 1) and n_boot={n_boot} >= 1")
    diffs = []
    for s, (xa, xb) in enumerate(zip(a, b, strict=True)):
        da, db = np.asarray(xa, dtype=np.float64), np.asarray(xb, dtype=np.float64)
        if da.ndim != 1 or da.shape != db.shape or da.size < 1:
            raise ValueError(f"seed {s}: a has shape {da.shape} and b {db.shape}: each seed "
                             "needs the same questions (at least one) in both arms")
        diffs.append(da - db)
    rng = np.random.default_rng(seed)
    n_seeds = len(diffs)
    drawn = rng.integers(0, n_seeds, size=(n_boot, n_seeds))  # (n_boot, S) seed per slot
    slot_means = np.empty((n_boot, n_seeds))
    for j in range(n_seeds):  # slot j: its drawn seed's question resample, per draw
        for s, d in enumerate(diffs):
            rows = np.flatnonzero(drawn[:, j] == s)
            q = rng.integers(0, d.size, size=(rows.size, d.size))
            slot_means[rows, j] = d[q].mean(axis=1)
    stats = slot_means.mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(stats, [tail, 1 - tail], method="inverted_cdf")
    return PairedInterval(diff=float(np.mean([d.mean() for d in diffs])), low=float(low),
                          high=float(high), level=level,
                          questions=int(sum(d.size for d in diffs)), runs=(n_seeds, n_seeds))
