"""A policy update as a ``torchrun`` job (issue 13 item 3): 2 ranks on CPU gloo (DDP, rank 0
reads the samples and broadcasts them, rank 0 writes the checkpoint) end with the weights of
a 1-rank job given the same samples. Tolerance 1e-6 absolute: the same micro-batches, only
the order of the float sums differs (each rank sums its own micro-batches, then the
all-reduce adds the two). 12 samples in micro-batches of 4 are 3 micro-batches, so rank 1
also runs the zero-weighted pass that keeps DDP's collectives matched. Resume: a 2-rank job
that starts from version 1's weights and its DCP optimizer state ends where one process
doing both updates with one Adam ends (the moments and step were restored, not reset)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory):
    from mgrpo.models import TinyModelConfig, init_tiny

    root = tmp_path_factory.mktemp("ddp")
    model = init_tiny(root / "tiny", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400))
    rng = random.Random(0)
    rows = []
    for i in range(12):
        n = rng.randint(8, 20)
        prompt = n // 2
        rows.append({"trajectory": {
            "traj_id": f"t{i}", "round_id": "r", "query_id": f"q{i // 4}", "rollout": i % 4,
            "agent": "planner", "model": "planner",
            "input_ids": [rng.randint(5, 399) for _ in range(n)],
            "response_mask": [0] * prompt + [1] * (n - prompt),
            "old_logprobs": [0.0] * prompt + [-6.0] * (n - prompt)},
            "advantage": rng.uniform(-1.5, 1.5), "reward": 0.0})
    samples = root / "samples.json"
    samples.write_text(json.dumps(rows))
    return Path(model), samples, root


def run_job(ranks: int, model: Path, samples: Path, out: Path, version: int = 1) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", "-m", "mgrpo.training.distributed",
               "--model", str(model), "--samples", str(samples), "--out", str(out),
               "--name", "planner", "--version", str(version), "--micro-batch-size", "4",
               "--lr", "1e-3"] + (["--resume-version", str(version - 1)] if version > 1 else [])
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("{"))
    return json.loads(line)


@pytest.fixture(scope="module")
def first_jobs(job_inputs):
    model, samples, root = job_inputs
    return run_job(1, model, samples, root / "one"), run_job(2, model, samples, root / "two")


def test_two_ranks_end_with_the_weights_of_one(job_inputs, first_jobs):
    from safetensors.torch import load_file

    model, samples, root = job_inputs
    one, two = first_jobs
    assert (one["ranks"], two["ranks"]) == (1, 2)
    folder_1, folder_2 = (Path(r["uri"].removeprefix("file://")) for r in (one, two))
    for folder in (folder_1, folder_2):  # the single-process trainer's folder format
        manifest = json.loads((folder / "manifest.json").read_text())
        assert "model.safetensors" in manifest["files"]
        assert len(manifest["files"]["model.safetensors"]["sha256"]) == 64
    w1, w2 = load_file(folder_1 / "model.safetensors"), load_file(folder_2 / "model.safetensors")
    w0 = load_file(model / "model.safetensors")
    assert w1.keys() == w2.keys()
    moved = max(float((w1[k] - w0[k]).abs().max()) for k in w1)
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    print(f"max |w(1 rank) - w(2 ranks)| = {diff:.3g}; max move from init = {moved:.3g}; "
          f"update s: 1 rank {one['update_s']:.3f}, 2 ranks {two['update_s']:.3f}")
    assert moved > 1e-4  # the update did something
    assert diff <= 1e-6
    assert one["metrics"].keys() == two["metrics"].keys()
    assert {"pg_loss", "grad_norm", "planner/rollout_kl"} <= one["metrics"].keys()
    for key, value in one["metrics"].items():  # pi_old rows gathered from both ranks too
        assert value == pytest.approx(two["metrics"][key], abs=1e-5), key
    torch.testing.assert_close(w1["model.embed_tokens.weight"], w2["model.embed_tokens.weight"],
                               atol=1e-6, rtol=0)


def test_two_ranks_resume_with_the_optimizer_state(job_inputs, first_jobs):
    from safetensors.torch import load_file

    from mgrpo.models import load_model
    from mgrpo.training.config import LossConfig, ModelConfig
    from mgrpo.training.distributed import read_samples
    from mgrpo.training.update import policy_update

    model, samples, root = job_inputs
    assert (root / "two" / "planner" / "v000001.optim-dcp").is_dir()
    resumed = run_job(2, model, samples, root / "two", version=2)
    w2 = load_file(Path(resumed["uri"].removeprefix("file://")) / "model.safetensors")
    net, tokenizer = load_model(model)[:2]  # one process, one Adam, two updates
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    mcfg = ModelConfig(path=str(model), lr=1e-3, micro_batch_size=4)

    def update(optimizer) -> dict:
        policy_update(net, optimizer, read_samples(str(samples)), mcfg, LossConfig(),
                      pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
        return {k: v.clone() for k, v in net.state_dict().items()}

    after_first = update(optimizer)
    state = update(optimizer)
    diff = max(float((w2[k] - state[k]).abs().max()) for k in w2)
    net.load_state_dict(after_first)  # the control: the second update with a FRESH Adam
    fresh = update(torch.optim.Adam(net.parameters(), lr=1e-3))
    fresh_diff = max(float((w2[k] - fresh[k]).abs().max()) for k in w2)
    print(f"max |w(2 ranks, resumed v2) - w(one process, 2 updates)| = {diff:.3g}; "
          f"vs a fresh optimizer for update 2: {fresh_diff:.3g}")
    assert diff <= 1e-6
    assert fresh_diff > 1e-5  # so the restored moments are what made them equal
