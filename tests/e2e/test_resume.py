"""Resume after a crash: the same final weights as an uninterrupted run with the same seed.

A planner warm-started briefly on expert demonstrations (so rewards vary and updates are not
zero: a random model's all-zero rewards would give zero advantages and pass vacuously) is
trained for 3 rounds three ways: uninterrupted; stopped after round 1 then resumed; and in a
subprocess killed with SIGKILL once round 1 is checkpointed, then resumed in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from benchmark_sizes import SMALL

from mgrpo.training.config import RunConfig
from mgrpo.training.loop import run_training

pytestmark = pytest.mark.heavy
ROUNDS = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(bench_dir, planner_path, subagent_path): a tiny planner SFT'd for 60 steps."""
    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.envs.demos import write_demos
    from mgrpo.envs.experts import ExpertErrors
    from mgrpo.models import TinyModelConfig, init_tiny, load_model
    from mgrpo.models.sft import SFTConfig, load_sft_jsonl, train_sft
    from mgrpo.training.system import build_tools

    root = tmp_path_factory.mktemp("resume")
    bench = build_benchmark(BenchmarkConfig(seed=0, n_train=120, n_dev=40, n_test=40,
                                            entities=SMALL))
    bench.save(root / "bench")
    tools = build_tools(bench, ["searcher", "coder"])
    write_demos(bench, root / "demos", tools, ExpertErrors.parse("planner.skip_delegation=0.5"),
                n=200, stage=1, seed=0)
    texts = [d.text for d in bench.corpus.docs] + [
        "".join(s.text for s in e.segments) for e in load_sft_jsonl(root / "demos/planner.jsonl")]
    config = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=128, vocab_size=600)
    init_tiny(root / "init", config, corpus_texts=texts)
    model, tokenizer = load_model(root / "init")
    torch.manual_seed(0)
    train_sft(model, tokenizer, load_sft_jsonl(root / "demos/planner.jsonl"),
              SFTConfig(steps=60, batch_size=16, lr=3e-3, eval_every=60, seed=0))
    model.save_pretrained(root / "planner")
    tokenizer.save_pretrained(root / "planner")
    return root / "bench", root / "planner", root / "init"


def _cfg(setup, out: Path) -> RunConfig:
    bench_dir, planner, sub = setup
    return RunConfig.model_validate({
        "name": "resume", "seed": 3, "algorithm": "mgrpo",
        "models": {"planner": {"path": str(planner), "lr": 1e-3, "micro_batch_size": 8},
                   "searcher": {"path": str(sub), "lr": 1e-3, "micro_batch_size": 8},
                   "coder": {"path": str(sub), "lr": 1e-3, "micro_batch_size": 8}},
        "k": 4, "queries_per_round": 4,
        "sampling": {"planner_max_turns": 3, "subagent_max_turns": 2, "max_new_tokens": 24},
        "stages": [{"stage": 1, "rounds": ROUNDS}], "eval_questions": 4,
        "bench_dir": str(bench_dir), "out_dir": str(out)})


def _weights(out: Path, model: str) -> dict[str, torch.Tensor]:
    from mgrpo.models.checkpoint import load_checkpoint

    state, _ = load_checkpoint(str(out / "checkpoints" / "resume"), model, version=ROUNDS)
    return state


def _assert_same_weights(a: Path, b: Path, start: Path) -> None:
    from mgrpo.models import load_model

    initial = load_model(start)[0].state_dict()
    for model in ("planner", "searcher", "coder"):
        wa, wb = _weights(a, model), _weights(b, model)
        assert wa.keys() == wb.keys()
        for key in wa:
            torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4, msg=key)
    moved = max(float((_weights(a, "planner")[k] - initial[k]).abs().max())
                for k in _weights(a, "planner") if k in initial)
    assert moved > 1e-4, "the planner never changed: the comparison would be vacuous"


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    result = run_training(_cfg(setup, out), progress=False)
    assert result.rounds == ROUNDS
    return out


def test_stop_then_resume_matches(setup, uninterrupted, tmp_path):
    out = tmp_path / "run"
    first = run_training(_cfg(setup, out), progress=False, stop_after=1)
    assert first.rounds == 1 and first.after == {}
    second = run_training(_cfg(setup, out), resume=True, progress=False)
    assert second.rounds == ROUNDS
    _assert_same_weights(uninterrupted, out, setup[1])


def test_sigkill_then_resume_matches(setup, uninterrupted, tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(setup, out)
    config_file = tmp_path / "cfg.yaml"
    # sort_keys=False: the agents' order is the order of the planner's agent cards (its prompt)
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    code = ("import sys; from mgrpo.training.config_files import load_run_config; "
            "from mgrpo.training.loop import run_training; "
            "run_training(load_run_config(sys.argv[1]), progress=False)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(config_file)], env=env)
    state = out / "state.json"
    try:
        while proc.poll() is None:
            if state.exists() and json.loads(state.read_text())["completed_rounds"] >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed mid-run"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    done = json.loads(state.read_text())["completed_rounds"]
    assert 1 <= done < ROUNDS, f"killed after {done} rounds: not mid-run"
    result = run_training(cfg, resume=True, progress=False)
    assert result.rounds == ROUNDS
    _assert_same_weights(uninterrupted, out, setup[1])


class _Crash(RuntimeError):
    pass


def test_crash_between_checkpoint_and_state_file(setup, uninterrupted, tmp_path, monkeypatch):
    """The narrowest window: round 2's weights and optimizer moments are written, the state
    file still says 1 round. Resume must restart round 2 from round 1's weights AND moments."""
    from mgrpo.training import run_state

    real = run_state.write_json_atomic

    def crash_on_second_state(path, data):
        if Path(path).name == run_state.STATE_FILE and data.get("completed_rounds") == 2:
            raise _Crash("killed after the checkpoint, before the state file")
        real(path, data)

    out = tmp_path / "run"
    monkeypatch.setattr(run_state, "write_json_atomic", crash_on_second_state)
    with pytest.raises(_Crash):
        run_training(_cfg(setup, out), progress=False)
    monkeypatch.setattr(run_state, "write_json_atomic", real)
    assert json.loads((out / "state.json").read_text())["completed_rounds"] == 1
    result = run_training(_cfg(setup, out), resume=True, progress=False)
    assert result.rounds == ROUNDS
    _assert_same_weights(uninterrupted, out, setup[1])
