"""Progress bars on long steps (demonstrations, SFT, eval, rounds), quiet when stderr is not
a terminal or MGRPO_PROGRESS=0. Before, `data demos` ran 56 s and `eval` 23 s silent."""

from __future__ import annotations

import io
import sys

from mgrpo.envs.demos import write_demos
from mgrpo.envs.experts import ExpertErrors
from mgrpo.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _count(items, **kwargs) -> int:
    return sum(1 for _ in progress_bar(items, desc="work", **kwargs))


def test_bar_shows_on_a_terminal_only(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert _count(range(7)) == 7
    assert "work: 100%" in terminal.getvalue() and "7/7" in terminal.getvalue()
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert _count(range(7)) == 7 and piped.getvalue() == ""


def test_bar_off_when_disabled(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert _count(range(3), enabled=False) == 3
    monkeypatch.setenv("MGRPO_PROGRESS", "0")
    assert _count(range(3)) == 3
    assert terminal.getvalue() == ""


def test_demos_show_progress_per_episode(monkeypatch, tmp_path):
    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.training.system import build_tools

    bench = build_benchmark(BenchmarkConfig(n_train=20, n_dev=5, n_test=5))
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    summary = write_demos(bench, tmp_path, build_tools(bench, ["searcher", "coder"]),
                          ExpertErrors(), n=12, progress=True)
    assert summary["episodes"] == 12
    assert "demos: 100%" in terminal.getvalue() and "12/12" in terminal.getvalue()
