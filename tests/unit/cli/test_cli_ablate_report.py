"""``mgrpo ablate`` writes its report under its own out dir, never into docs/results.md by
default (before, a trial run overwrote the committed results)."""

from __future__ import annotations

import inspect
from pathlib import Path

from mgrpo.cli.run import ablate
from mgrpo.training.ablate import AblateConfig


def test_report_goes_under_the_out_dir_by_default(tmp_path):
    assert AblateConfig(out_dir=str(tmp_path)).results_path() == tmp_path / "results.md"
    assert AblateConfig().results_path() == Path("runs/ablate/results.md")
    chosen = AblateConfig(out_dir=str(tmp_path), results_md="docs/results.md")
    assert chosen.results_path() == Path("docs/results.md")  # only when asked


def test_cli_default_is_not_the_docs():
    default = inspect.signature(ablate).parameters["results"].default
    assert default.default is None
