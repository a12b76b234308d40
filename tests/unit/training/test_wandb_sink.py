"""The optional Weights & Biases sink (issue 14 item 3): ``report_to: [tensorboard, wandb]``.

wandb is not in the main venv: the offline test runs ``wandb_runs.py`` under ``make
wandb-venv`` (``.venv-wandb``, wandb 0.31.0 on the main venv's packages) with
``WANDB_MODE=offline`` (no network, no account): a real embedded run and a real distributed
round (in-process services, real trainers), then compares what the offline W&B run files hold
with the TensorBoard events of the same runs, key by key and step by step. Without that venv
the test skips, except under ``CI=true``, where it fails. About 40 s here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_wandb_without_the_package_is_one_line_error(tmp_path, monkeypatch):
    from mgrpo.training.metrics import MetricsLogger
    from mgrpo.training.wandb_sink import INSTALL_HINT

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError) as info:
        MetricsLogger(tmp_path, enabled=False, report_to=["tensorboard", "wandb"])
    assert str(info.value) == INSTALL_HINT and "\n" not in INSTALL_HINT
    assert "pip install 'mgrpo[wandb]'" in INSTALL_HINT
    assert list(tmp_path.iterdir()) == []  # refused before writing anything


def test_trainer_with_wandb_but_no_package_refuses_at_start(tmp_path, monkeypatch):
    from mgrpo.bus import InMemoryBus
    from mgrpo.config import Settings
    from mgrpo.models import TinyModelConfig, init_tiny
    from mgrpo.services.context import open_store
    from mgrpo.services.trainer.service import TrainerService
    from mgrpo.training.config import RunConfig

    tiny = init_tiny(tmp_path / "tiny", TinyModelConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, vocab_size=400))
    cfg = RunConfig.model_validate({"models": {"planner": {"path": str(tiny)}},
                                    "agents": {"planner": "planner"}, "report_to": ["wandb"]})
    settings = Settings(database_url=f"sqlite:///{tmp_path}/s.db")
    store = open_store(settings)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"^report_to includes wandb but the wandb package"):
        TrainerService(settings, cfg, store, InMemoryBus(store), "planner")


def test_report_to_empty_writes_no_tensorboard(tmp_path):
    from mgrpo.training.config import RunConfig
    from mgrpo.training.metrics import MetricsLogger

    base = {"models": {"planner": {"path": "x"}}, "agents": {"planner": "planner"}}
    assert RunConfig.model_validate(base).report_to == ["tensorboard"]  # W&B off by default
    with pytest.raises(ValueError, match="report_to"):
        RunConfig.model_validate({**base, "report_to": ["mlflow"]})
    logger = MetricsLogger(tmp_path, enabled=False, report_to=[])
    logger.log(0, {"planner/reward_mean": 0.5})
    logger.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]


def wandb_python() -> Path:
    venv = Path(os.environ.get("MGRPO_WANDB_VENV", ROOT / ".venv-wandb"))
    if not (venv / "bin" / "python").exists():
        message = f"{venv}/bin/python missing: run `make wandb-venv` (wandb==0.31.0)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return venv / "bin" / "python"


def tensorboard_series(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


TABLES = ("completions",)  # logged as W&B tables (history keys "completions/..."), not scalars


def wandb_series(history: list[dict]) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    for row in history:
        for key, value in row.items():
            if key != "_step" and key.split("/")[0] not in TABLES:
                series.setdefault(key, {})[row["_step"]] = value
    return series


def table_steps(history: list[dict], key: str = "completions") -> list[int]:
    """The steps at which the run logged the table ``key``."""
    return sorted(row["_step"] for row in history
                  if any(k.split("/")[0] == key for k in row))


def assert_same(wandb: dict, tensorboard: dict) -> int:
    """Every finite TensorBoard point is in W&B at the same step, with the same value (TB
    keeps float32), and W&B has nothing else. Returns the number of points compared."""
    finite = {k: {s: v for s, v in points.items() if math.isfinite(v)}
              for k, points in tensorboard.items()}
    finite = {k: v for k, v in finite.items() if v}
    assert sorted(wandb) == sorted(finite)
    for key, points in finite.items():
        assert sorted(wandb[key]) == sorted(points), key
        for step, value in points.items():
            assert wandb[key][step] == pytest.approx(value, rel=1e-6, abs=1e-6), (key, step)
    return sum(len(p) for p in finite.values())


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_offline_runs_hold_what_tensorboard_holds(tmp_path):
    python = wandb_python()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WANDB_DIR", None)
    proc = subprocess.run([str(python), str(Path(__file__).with_name("wandb_runs.py")),
                           str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=560, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])

    # embedded: one W&B run named after the run, in <out_dir>/wandb, = <out_dir>/tensorboard
    (name,) = runs["embedded"]
    run = runs["embedded"][name]
    assert name == "wb" and run["group"] == "wb"
    assert Path(run["dir"]).parent == tmp_path / "embedded" / "run" / "wandb"
    embedded = wandb_series(run["history"])
    assert sorted(embedded["eval/greedy/accuracy"]) == [0, 1]  # before and after
    assert 0 in embedded["planner/reward_mean"] and 0 in embedded["planner/pg_loss"]
    compared = assert_same(embedded, tensorboard_series(tmp_path / "embedded" / "run" /
                                                        "tensorboard"))
    assert compared >= 40
    assert table_steps(run["history"]) == [0]  # the round's completions (log_completions)

    # distributed: one W&B run per (run, model) under WANDB_DIR, = the trainers' TB events
    # and the store's metrics of the round
    assert sorted(runs["distributed"]) == ["wbsvc-coder", "wbsvc-planner", "wbsvc-searcher"]
    recorded = json.loads((tmp_path / "distributed" / "recorded.json").read_text())
    for model in ("planner", "searcher", "coder"):
        run = runs["distributed"][f"wbsvc-{model}"]
        assert run["group"] == "wbsvc"
        assert Path(run["dir"]).parent == tmp_path / "wandb_dir" / "wandb"
        series = wandb_series(run["history"])
        assert_same(series, tensorboard_series(tmp_path / "distributed" / "tb" / "wbsvc" /
                                               model))
        assert series[f"{model}/trajectories"] == {0: recorded[f"{model}/trajectories"]}
        if recorded[f"{model}/trajectories"]:  # a few of them, decoded, as a table
            assert table_steps(run["history"]) == [0]
        assert series[f"{model}/pg_loss"][0] == pytest.approx(recorded[f"{model}/pg_loss"])
