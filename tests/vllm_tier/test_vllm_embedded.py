"""An embedded M-GRPO round with the planner on vLLM (``engines: {planner: vllm}``): the
registry builds the VLLMEngine in the run's own process, the round's planner turns are
sampled by it, the trainer updates the torch planner, and the checkpoint reaches the running
vLLM through ``sync_sampler`` -> ``VLLMEngine.load_weights`` (the worker extension's in-place
reload, as in the services' vLLM workers). One vLLM start.

The run (``embedded_vllm_run.py``) needs vLLM in its own process, so it runs with the vLLM
venv's python (the main venv's packages after that venv's own). Models: the parity tests'
warm start (``tiny_assets.prepare_cached``), 4 questions x K=2, so the planner's groups have
reward variance and the step moves its weights.

Checked, per-token |logp| at T = 1 within the tier's ``TOLERANCE``:
- the round's planner tokens (vLLM, before the step) against the starting planner;
- after the step, vLLM's samples of the round's planner prompts against the trainer's
  UPDATED planner teacher-forced, and no longer against the starting one (more than 100x
  the tolerance away), with weights version 1 on both sides.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import yaml
from vllm_process import TOLERANCE, print_figure, vllm_env, vllm_venv

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "services"))

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1800)]
RUN = Path(__file__).with_name("embedded_vllm_run.py")


def test_an_embedded_round_samples_with_vllm_and_vllm_gets_the_updated_weights(tmp_path):
    from parity_kit import PARITY_SFT_STEPS
    from round_harness import make_config

    from mgrpo.experiments.tiny_assets import prepare_cached

    venv = vllm_venv()  # skip (or fail in CI) before building the models when there is no vLLM
    warm = prepare_cached(PARITY_SFT_STEPS)
    cfg = make_config(warm, tmp_path / "run", b=4, k=2, name="vllm-embedded")
    data = {**cfg.model_dump(mode="json", exclude_unset=True), "engines": {"planner": "vllm"}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    log = tmp_path / "run.log"
    t0 = time.perf_counter()
    with log.open("w") as err:
        done = subprocess.run(
            [str(venv / "bin" / "python"), str(RUN), str(config)], stdout=subprocess.PIPE,
            stderr=err, text=True, timeout=1700, cwd=str(tmp_path),
            env={**vllm_env(), "MGRPO_MAIN_SITE": sysconfig.get_paths()["purelib"]})
    wall = time.perf_counter() - t0
    assert done.returncode == 0 and done.stdout.strip(), log.read_text()[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print_figure("embedded vllm round (start-up, round, checks) s", round(wall, 1))
    print_figure("embedded vllm round: result", got)
    assert got["grad_norm"] > 0  # the planner did update
    assert got["version"] == got["engine_version"] == 1
    assert got["round_trajectories"] == 4 * 2
    assert got["round_max_diff_start"] < TOLERANCE  # vLLM sampled the round (start weights)
    assert got["after_tokens"] >= 8
    assert got["after_max_diff_new"] < TOLERANCE  # vLLM samples with the updated weights
    assert got["after_max_diff_start"] > 100 * TOLERANCE  # ... not with the old ones


SHARED = Path(__file__).with_name("embedded_vllm_shared_base.py")


def test_two_lora_agents_on_one_base_share_one_vllm_instance(tmp_path):
    """planner and searcher as LoRA adapters on the warm planner's weights, both on vLLM:
    load_models builds one vLLM instance and gives the searcher an adapter engine on it; two
    rounds, each agent's adapter pushed after each, and vLLM's samples of each agent agree
    with that agent's trainer, the planner's adapter having moved."""
    from parity_kit import PARITY_SFT_STEPS
    from round_harness import make_config

    from mgrpo.experiments.tiny_assets import prepare_cached

    venv = vllm_venv()
    warm = prepare_cached(PARITY_SFT_STEPS)
    cfg = make_config(warm, tmp_path / "run", b=4, k=2, name="vllm-shared-base")
    data = cfg.model_dump(mode="json", exclude_unset=True)
    base = data["models"]["planner"]["path"]
    for role in ("planner", "searcher"):
        data["models"][role] = {**data["models"][role], "path": base, "lr": 1e-3,
                                "lora": {"r": 8, "alpha": 16}}
    data["engines"] = {"planner": "vllm", "searcher": "vllm"}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    log = tmp_path / "run.log"
    with log.open("w") as err:
        done = subprocess.run(
            [str(venv / "bin" / "python"), str(SHARED), str(config)], stdout=subprocess.PIPE,
            stderr=err, text=True, timeout=1700, cwd=str(tmp_path), env=vllm_env())
    assert done.returncode == 0 and done.stdout.strip(), log.read_text()[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print_figure("two LoRA agents on one vLLM base: result", got)
    assert got["one_instance"] is True
    assert got["versions"] == [2, 2]
    assert None not in got["lora_ids"] and len(set(got["lora_ids"])) == 2
    assert got["grad_norm"]["planner/0"] > 0  # the planner's adapter moved in round 0
    assert max(v for v in got["diff"].values() if v is not None) < TOLERANCE
