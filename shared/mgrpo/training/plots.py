"""PNG plots of a run's metrics (``mgrpo plot RUN``): reward and accuracy curves per agent."""

from __future__ import annotations

from pathlib import Path

from mgrpo.training.metrics import read_metrics

PANELS = {
    "rewards": ("reward_mean",),
    "accuracy": ("planner/accuracy", "eval/greedy/accuracy", "eval/sampled/accuracy"),
    "calls": ("calls_per_episode",),
    "loss": ("clipfrac", "approx_kl", "entropy"),
    "time": ("time/",),
}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """One PNG per panel; a series goes in a panel when its key contains a panel pattern."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    out = Path(out_dir or run_dir / "plots")
    out.mkdir(parents=True, exist_ok=True)
    series = read_metrics(run_dir)
    written = []
    for panel, patterns in PANELS.items():
        keys = sorted(k for k in series if any(p in k for p in patterns))
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for key in keys:
            xs, ys = zip(*series[key], strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=key)
        ax.set_xlabel("round")
        ax.set_title(f"{run_dir.name}: {panel}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{panel}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
