"""Cost of the KL reference (``loss.kl_coef > 0``): extra memory and policy-update time.

A demo-size tiny Qwen2 (``TinyModelConfig()`` defaults, ~1M parameters), a synthetic batch of
``--batch`` sequences (``--prompt`` prompt + ``--generated`` response tokens, advantages
+-1), micro-batch 16. ``policy_update`` is timed without KL and with the frozen reference
(``mgrpo.training.reference.load_reference``: the starting weights, loaded from disk); best of
``--repeats``. The reference's memory is its weights (no gradients, no optimizer moments).

Prints JSON. Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/kl_cost.py [--batch 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=120)
    parser.add_argument("--generated", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from mgrpo.models import TinyModelConfig, init_tiny, load_model
    from mgrpo.training.config import LossConfig, ModelConfig
    from mgrpo.training.reference import load_reference
    from mgrpo.training.scoring import Sample
    from mgrpo.training.update import UpdateSpec, policy_update
    from mgrpo.types import Trajectory

    torch.manual_seed(0)
    folder = init_tiny(Path(tempfile.mkdtemp()) / "m", TinyModelConfig(seed=0))
    model, tok = load_model(folder)
    width = args.prompt + args.generated
    samples = [Sample(Trajectory(
        traj_id=f"r/q/{i}/planner/0", round_id="r", query_id="q", rollout=i, agent="planner",
        model="planner", input_ids=torch.randint(10, len(tok) - 1, (width,)).tolist(),
        response_mask=[0] * args.prompt + [1] * args.generated, old_logprobs=[0.0] * width),
        advantage=1.0 if i % 2 else -1.0, reward=0.0) for i in range(args.batch)]
    mcfg = ModelConfig(path=str(folder), micro_batch_size=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def best(loss: LossConfig, ref) -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            policy_update(model, optimizer, samples, UpdateSpec(mcfg, loss, tok.pad_token_id),
                          ref_model=ref)
            times.append(time.perf_counter() - start)
        return min(times)

    no_kl = best(LossConfig(), None)
    ref = load_reference(str(folder))
    with_kl = best(LossConfig(kl_coef=0.05), ref)
    print(json.dumps({
        "parameters": sum(p.numel() for p in model.parameters()),
        "reference_weights_mb": round(sum(p.numel() * p.element_size()
                                          for p in ref.parameters()) / 2**20, 2),
        "batch": f"{args.batch} x {width} tokens", "update_s_without_kl": round(no_kl, 2),
        "update_s_with_kl": round(with_kl, 2),
        "overhead_pct": round(100 * (with_kl / no_kl - 1), 1),
        "load_average": os.getloadavg()[0], "omp_threads": os.environ.get("OMP_NUM_THREADS"),
    }, indent=1))


if __name__ == "__main__":
    main()
