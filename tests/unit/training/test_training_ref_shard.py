"""The KL reference under data parallel: a 2-rank ``torchrun`` job on CPU gloo
(``ref_shard_job.py``) against the same update in one process, with FSDP2 (the trainer's default).

- the reference is sharded like the policy: its parameters on each rank are FSDP2 shards
  (DTensors), about half of its parameters each, the two halves adding up to the whole;
- each rank runs the reference's no-grad forward over its own half of the batch (4 of 8
  rows), and the pi_old pass of the second mini-batch over its half of those rows (2 of 4);
- the updated weights equal the single-process update within 1e-5 absolute, under 1% of how
  far the update moves them (only the float summation order differs: with the KL term's extra
  reductions, Adam's normalisation of near-zero gradients turns it into differences of
  3e-7 to 3.3e-6 across runs), and so do the metrics, the KL among them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]
JOB = Path(__file__).resolve().parent / "ref_shard_job.py"


def run_job(nproc: int, tiny: Path, ref: Path, out: Path) -> list[dict]:
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", str(JOB), str(tiny), str(ref),
                           str(out)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


def test_reference_sharded_and_run_on_each_ranks_share(tmp_path):
    from mgrpo.models import TinyModelConfig, init_tiny, load_model

    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, intermediate_size=64, vocab_size=400)
    tiny = init_tiny(tmp_path / "tiny", TinyModelConfig(seed=0, **shape))
    ref = init_tiny(tmp_path / "ref", TinyModelConfig(seed=1, **shape))  # not the policy
    sys.path.insert(0, str(JOB.parent))
    from ref_shard_job import update_once

    one = update_once(str(tiny), str(ref))  # one process, no process group
    two = run_job(2, tiny, ref, tmp_path / "two")

    whole = one["ref_numel"]
    shares = [r["ref_numel"] for r in two]
    print(f"reference numel: one rank {whole}, per rank of two {shares}")
    assert not one["ref_dtensor"] and all(r["ref_dtensor"] for r in two)
    assert sum(shares) == whole and all(0.45 * whole <= s <= 0.55 * whole for s in shares)

    assert one["seen"] == {"ref": [2, 2, 2, 2], "pi_old": [2, 2]}
    for r in two:
        assert r["seen"] == {"ref": [2, 2], "pi_old": [2]}, r["seen"]

    initial = {k: p.detach() for k, p in load_model(str(tiny))[0].named_parameters()}
    moved = max(float((one["weights"][k] - initial[k]).abs().max()) for k in initial)
    diff = max(float((one["weights"][k] - two[0]["weights"][k]).abs().max())
               for k in one["weights"])
    print(f"max |w(1 rank) - w(2 ranks)| = {diff:.3g} (the update moved weights by up to "
          f"{moved:.3g})")
    assert moved > 1e-4 and diff <= 1e-5 and diff < 0.01 * moved, (moved, diff)
    for r in two:
        assert all(torch.equal(r["weights"][k], two[0]["weights"][k]) for k in r["weights"])
        assert r["metrics"].keys() == one["metrics"].keys()
        for key, value in one["metrics"].items():
            assert r["metrics"][key] == pytest.approx(value, abs=1e-5), key
    assert one["metrics"]["planner/kl"] > 1e-3  # the reference differs: the KL term acts
