"""Issue 17.5: plots show only what was measured. Held-out evaluations are points (no line
joining rounds 0 and 40 as if progress between them had been measured); the loss panel shows
the loss itself, with clip fraction, KL and entropy on axes of their own."""

from __future__ import annotations

import csv

import matplotlib
from training_testkit import run_config_dict

from mgrpo.experiments.plots import panel_figure, plot_run
from mgrpo.training.config import RunConfig
from mgrpo.training.loop import run_training
from mgrpo.training.metrics import read_metrics

matplotlib.use("Agg")


def _write_metrics(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "metrics.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["round", "key", "value"])
        writer.writerows(rows)


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_evaluations_are_points_and_training_accuracy_a_line(tmp_path):
    rows = [(r, "planner/accuracy", 0.1 + 0.01 * r) for r in range(40)]
    rows += [(0, "eval/greedy/accuracy", 0.2), (20, "eval/greedy/accuracy", 0.3),
             (40, "eval/greedy/accuracy", 0.45), (0, "eval/sampled/accuracy", 0.1),
             (40, "eval/sampled/accuracy", 0.3)]
    _write_metrics(tmp_path / "run", rows)
    fig = panel_figure(read_metrics(tmp_path / "run"), "accuracy", "run")
    lines = _lines(fig.axes[0])
    greedy = lines["eval/greedy/accuracy (evaluated)"]
    assert greedy.get_linestyle() == "None" and greedy.get_marker() == "o"
    assert list(greedy.get_xdata()) == [0, 20, 40]
    assert list(greedy.get_ydata()) == [0.2, 0.3, 0.45]
    sampled = lines["eval/sampled/accuracy (evaluated)"]
    assert sampled.get_linestyle() == "None" and list(sampled.get_xdata()) == [0, 40]
    assert sampled.get_marker() == "s"  # another shape: equal values at a round stay visible
    train = lines["planner/accuracy"]
    assert train.get_linestyle() == "-" and len(train.get_xdata()) == 40


def test_loss_panel_shows_the_loss_and_separate_labelled_axes(tmp_path):
    rows = []
    for r in range(5):
        rows += [(r, "planner/loss", -0.05 * r), (r, "planner/pg_loss", -0.05 * r),
                 (r, "planner/clipfrac", 0.0), (r, "planner/clipfrac_low", 0.0),
                 (r, "planner/approx_kl", 1e-4), (r, "planner/entropy", 2.0 - 0.1 * r),
                 (r, "searcher/loss", 0.01)]
    _write_metrics(tmp_path / "run", rows)
    fig = panel_figure(read_metrics(tmp_path / "run"), "loss", "run")
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["loss", "clip fraction", "KL", "entropy (nats/token)"]
    loss = _lines(fig.axes[0])
    assert set(loss) == {"planner/loss", "planner/pg_loss", "searcher/loss"}
    assert list(loss["planner/loss"].get_ydata()) == [0.0, -0.05, -0.1, -0.15000000000000002,
                                                      -0.2]
    assert set(_lines(fig.axes[1])) == {"planner/clipfrac"}  # not the _low/_high parts
    assert set(_lines(fig.axes[2])) == {"planner/approx_kl"}
    paths = plot_run(tmp_path / "run")
    assert sorted(p.name for p in paths) == ["loss.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_eval_every_logs_greedy_points_once_per_round(tmp_path, tiny_dir, bench_dir):
    """eval_every=1 over 3 rounds: greedy held-out accuracy at rounds 0 (before), 1, 2 and
    3 (after), each logged exactly once; sampled only before and after."""
    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, eval_every=1, stages=[{"stage": 1, "rounds": 3}]))
    run_training(cfg, progress=False)
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    greedy = [int(r["round"]) for r in rows if r["key"] == "eval/greedy/accuracy"]
    sampled = [int(r["round"]) for r in rows if r["key"] == "eval/sampled/accuracy"]
    assert greedy == [0, 1, 2, 3]
    assert sampled == [0, 3]
    fig = panel_figure(read_metrics(tmp_path / "run"), "accuracy", "run")
    assert list(_lines(fig.axes[0])["eval/greedy/accuracy (evaluated)"].get_xdata()) \
        == [0, 1, 2, 3]
