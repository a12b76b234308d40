"""What `make demo` gave on the development machines, printed beside a run's own figures.

The demo pins its thread count and CPU kernels (:mod:`mgrpo.training.numerics`); the first
runs below had neither pinned, and other torch or MKL versions or ARM CPUs still give other
numbers: the runs below did not all start from the same warm start. A user compares their
run with this spread to tell a normal run from a broken one (``docs/results.md``,
"Reproducibility").
"""

from __future__ import annotations

from typing import NamedTuple


class MeasuredRun(NamedTuple):
    """Held-out accuracy (200 stage-1 test questions) of one full `make demo` run."""

    setting: str  # what was pinned, and where it ran
    greedy: tuple[float, float]  # (after the warm start, after the 40 RL rounds)
    sampled: tuple[float, float]


# Every full run of the default config reported in docs/results.md.
DEMO_RUNS = (
    MeasuredRun("threads and kernels unpinned", (0.225, 0.455), (0.160, 0.335)),
    MeasuredRun("unpinned, beside the test suite", (0.225, 0.430), (0.105, 0.265)),
    MeasuredRun("unpinned, repeated", (0.310, 0.570), (0.210, 0.400)),
    MeasuredRun("1 thread", (0.310, 0.555), (0.120, 0.355)),
    MeasuredRun("1 thread, AVX2 kernels", (0.250, 0.500), (0.110, 0.285)),
    MeasuredRun("1 thread, AVX2 kernels, repeated (identical)", (0.250, 0.500),
                (0.110, 0.285)),
)


def _span(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def demo_spread(cfg) -> str | None:
    """One line with the measured spread when ``cfg`` (a DemoConfig) is `make demo`'s own
    recipe, wherever its output goes and at any thread count; None for any other recipe,
    which these runs say nothing about."""
    default = type(cfg)(out_dir=cfg.out_dir, threads=cfg.threads)
    if cfg.model_dump() != default.model_dump():
        return None
    greedy = [r.greedy for r in DEMO_RUNS]
    sampled = [r.sampled for r in DEMO_RUNS]
    gains = [after - before for before, after in greedy]
    return (f"{len(DEMO_RUNS)} measured runs of this recipe (docs/results.md): greedy "
            f"{_span([b for b, _ in greedy])} after the warm start, "
            f"{_span([a for _, a in greedy])} after RL (gain "
            f"+{min(gains) * 100:.1f} to +{max(gains) * 100:.1f} points); sampled "
            f"{_span([b for b, _ in sampled])} -> {_span([a for _, a in sampled])}. "
            "Runs before the thread and kernel pins started from other warm starts: "
            "compare the gain.")
