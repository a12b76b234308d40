"""The round bench's repeats: the order in which a size's timed rounds run, and what they
come to (:func:`summarize`). Pure: no torch, no services (``round.py`` runs the rounds).

Order (:func:`mode_order`): the two modes alternate in ABBA pairs (embedded, distributed,
distributed, embedded, ...), so that a drift of the machine's load during a size weighs on
both modes alike. Summary: per-round times, the median per mode, the ratio of the medians
(distributed / embedded: the figure the goal is stated in) and each pair's ratio (its spread).

What it does NOT do: decide that a ratio is significant (with 3-5 pairs on a shared machine,
the per-pair ratios ARE the spread to report).
"""

from __future__ import annotations

from statistics import median

MODES = ("embedded", "distributed")


def mode_order(repeats: int) -> list[tuple[int, str]]:
    """(pair index, mode) in run order: pair i runs embedded first when i is even,
    distributed first when it is odd."""
    out = []
    for i in range(repeats):
        pair = MODES if i % 2 == 0 else MODES[::-1]
        out.extend((i, mode) for mode in pair)
    return out


def summarize(walls: dict[str, list[float]]) -> dict:
    """``walls``: mode -> round wall times in pair order (pair i = the i-th of each list).
    Returns the per-round times, the median per mode, the ratio of the medians, each pair's
    ratio and their range (min, max)."""
    emb, dist = walls["embedded"], walls["distributed"]
    if len(emb) != len(dist) or not emb:
        raise ValueError(f"need as many embedded as distributed rounds, >= 1: {walls}")
    pairs = [round(d / max(e, 1e-9), 3) for e, d in zip(emb, dist, strict=True)]
    med = {mode: round(median(walls[mode]), 3) for mode in MODES}
    return {
        "wall_s": {mode: [round(x, 3) for x in walls[mode]] for mode in MODES},
        "median_s": med,
        "ratio_of_medians": round(med["distributed"] / max(med["embedded"], 1e-9), 3),
        "pair_ratios": pairs,
        "pair_ratio_range": [min(pairs), max(pairs)],
    }
