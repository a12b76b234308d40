"""The demo's warm start (``demo.prepare``) on a tiny recipe: a second call on the same
folder reuses the three models and leaves the demonstrations alone. Before, every
`mgrpo ablate` call rewrote them (12 s on the demo's recipe, under a minute on
examples/ablate_stage2.yaml's, at load 0.5), even when every model
was already built, and two calls on one warm start wrote the same files at once. About
5 s on an idle 2-core machine."""

from __future__ import annotations

from pathlib import Path

from mgrpo.training.demo import ROLES, DemoConfig, prepare


def _files(folder: Path) -> dict[str, int]:
    """The demonstrations' files and times (the benchmark is saved again: atomically)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns
            for p in sorted(folder.glob("demos*/*.jsonl"))}


def test_a_built_warm_start_is_reused_without_rewriting_its_demonstrations(tmp_path, capsys):
    cfg = DemoConfig(out_dir=str(tmp_path), demos_per_agent=16, n_train=120, n_test=20,
                     vocab_size=300, sft_batch=4,
                     sft_steps={"planner": 2, "searcher": 2, "coder": 2},
                     train_entities={"city": 8, "person": 10, "company": 6})
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
