"""The demo's warm start (``demo.prepare``) on a tiny recipe: a second call on the same
folder reuses the three models and leaves the demonstrations alone. Before, every
`mgrpo ablate` call rewrote them (12 s on the demo's recipe, under a minute on
examples/ablate_stage2.yaml's, at load 0.5), even when every model
was already built, and two calls on one warm start wrote the same files at once. About
5 s on an idle 2-core machine.

Also: a folder holds one recipe (``mgrpo.experiments.demo_recipe``). A second call with another
recipe used to save its own benchmark over the one the folder's runs were evaluated on,
and reuse models built from the first recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgrpo.experiments.demo import ROLES, DemoConfig, prepare
from mgrpo.experiments.demo_recipe import RECIPE_FILE, claim


def _files(folder: Path) -> dict[str, int]:
    """The demonstrations' files and times (the benchmark is saved again: atomically)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns
            for p in sorted(folder.glob("demos*/*.jsonl"))}


def _tiny(tmp_path: Path, **fields) -> DemoConfig:
    tiny = {"demos_per_agent": 16, "n_train": 120, "n_test": 20, "vocab_size": 300,
            "sft_batch": 4, "sft_steps": {"planner": 2, "searcher": 2, "coder": 2},
            "train_entities": {"city": 8, "person": 10, "company": 6}}
    return DemoConfig(out_dir=str(tmp_path), **{**tiny, **fields})


def test_a_built_warm_start_is_reused_without_rewriting_its_demonstrations(tmp_path, capsys):
    cfg = _tiny(tmp_path)
    first = prepare(cfg, 0.0)
    assert sorted(first) == sorted(ROLES)
    assert all(Path(path, "config.json").exists() for path in first.values())
    demos = _files(tmp_path)
    assert any(name.startswith("demos/") for name in demos)
    weights = {role: Path(path, "model.safetensors").stat().st_mtime_ns
               for role, path in first.items()}
    capsys.readouterr()

    again = prepare(cfg, 0.0)
    assert again == first
    assert _files(tmp_path) == demos  # not rewritten
    assert {role: Path(path, "model.safetensors").stat().st_mtime_ns
            for role, path in again.items()} == weights
    assert "warm start: reusing planner, searcher, coder" in capsys.readouterr().out


def test_a_folder_refuses_another_recipe_before_writing_anything(tmp_path):
    prepare(_tiny(tmp_path), 0.0)
    bench = {str(p): p.stat().st_mtime_ns for p in (tmp_path / "bench").rglob("*")}
    recorded = json.loads((tmp_path / RECIPE_FILE).read_text())
    assert recorded["n_test"] == 20 and "rounds" not in recorded and "out_dir" not in recorded
    with pytest.raises(FileExistsError, match=r"another recipe \(n_test: 20 there, 40 now; "
                       r"seed: 0 there, 1 now\)"):
        prepare(_tiny(tmp_path, n_test=40, seed=1), 0.0)
    assert {str(p): p.stat().st_mtime_ns for p in (tmp_path / "bench").rglob("*")} == bench
    # what only shapes the RL rounds, the evaluation or the CPU may change on one warm start
    claim(_tiny(tmp_path, rounds=3, k=4, lr=1e-3, eval_every=0, eval_questions=7, threads=2,
                cpu_kernels="native", run_set={"max_staleness": 1,
                                               "loss.rollout_is": "token"}))
