"""PNG plots of a run's metrics (``mgrpo plot RUN``): rewards, accuracy, calls, loss, time.

A plot shows only what was measured. Series logged every round (training rewards, the loss)
are drawn as lines; held-out evaluations (``eval/...``), which happen only at some rounds
(start, end, every ``eval_every`` rounds), are drawn as markers with no line joining them, so
two evaluations 40 rounds apart never look like a measured curve between them. The loss panel
puts the loss, the clip fraction, the KL estimates and the entropy on axes of their own: each
has its own scale (clip fraction and KL near 0 would flatten the loss on a shared axis).
"""

from __future__ import annotations

from pathlib import Path

from mgrpo.training.metrics import read_metrics

# panel -> [(axis label, key suffixes)]; a key joins an axis when its last "/"-part is one
# of the suffixes (or, for a suffix ending in "/", when the key starts with it).
PANELS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "rewards": [("reward (mean over samples)", ("reward_mean",))],
    "accuracy": [("accuracy", ("accuracy",))],
    "calls": [("calls per episode", ("calls_per_episode",))],
    "loss": [("loss", ("loss", "pg_loss")),
             ("clip fraction", ("clipfrac",)),
             ("KL", ("approx_kl", "kl", "rollout_kl")),
             ("entropy (nats/token)", ("entropy",))],
    "time": [("seconds", ("time/",))],
}


EVAL_MARKERS = ["o", "s", "^", "D", "v"]


def _matches(key: str, suffixes: tuple[str, ...]) -> bool:
    last = key.rsplit("/", 1)[-1]
    return any(key.startswith(s) if s.endswith("/") else last == s for s in suffixes)


def is_evaluation(key: str) -> bool:
    """Held-out evaluations: measured at a few rounds only, drawn as points."""
    return key.startswith("eval/")


def panel_axes(series: dict[str, list], panel: str) -> list[tuple[str, list[str]]]:
    """The axes of ``panel`` that have data: [(label, keys)]."""
    out = []
    for label, suffixes in PANELS[panel]:
        keys = sorted(k for k in series if _matches(k, suffixes))
        if keys:
            out.append((label, keys))
    return out


def panel_figure(series: dict[str, list], panel: str, title: str):
    """The matplotlib figure of one panel (None when it has no data)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    axes_spec = panel_axes(series, panel)
    if not axes_spec:
        return None
    fig, axes = plt.subplots(len(axes_spec), 1, figsize=(7, 2.6 * len(axes_spec) + 0.8),
                             sharex=True, squeeze=False)
    for ax, (label, keys) in zip(axes[:, 0], axes_spec, strict=True):
        shapes = iter(EVAL_MARKERS * len(keys))
        for key in keys:
            xs, ys = zip(*series[key], strict=True)
            if is_evaluation(key):  # a shape of its own: equal values at a round stay visible
                ax.plot(xs, ys, linestyle="none", marker=next(shapes), markersize=7,
                        markerfacecolor="none", markeredgewidth=1.5, label=f"{key} (evaluated)")
            else:
                ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=key)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("round")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0, 0].set_title(f"{title}: {panel}")
    fig.tight_layout()
    return fig


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """One PNG per panel with data; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    out = Path(out_dir or run_dir / "plots")
    out.mkdir(parents=True, exist_ok=True)
    series = read_metrics(run_dir)
    written = []
    for panel in PANELS:
        fig = panel_figure(series, panel, run_dir.name)
        if fig is None:
            continue
        path = out / f"{panel}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
