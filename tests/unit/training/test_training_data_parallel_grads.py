"""A data-parallel update's gradient is the single process's, not a multiple of it: two CPU
gloo ranks run one optimizer step of ``policy_update`` on a model sharded by
``mgrpo.parallel.sharding.shard`` (FSDP2 and DDP), and each parameter's gradient (FSDP2:
gathered from its shards) equals one process's gradient of the same samples within 1e-6
absolute, and so does the reported ``grad_norm``. Each rank weights its micro-batch losses by
their share of the mini-batch and the sharded model sums the ranks' gradients; a loss scaled
by the world size, or gradients averaged over the ranks, would be off by a factor of 2.
Two cases: 7 rows in micro-batches of 2 (each rank runs two), and 5 rows (rank 1 makes a
zero-weighted padding pass) with a sequence-mean loss. The clip threshold is out of reach,
so clipping cannot hide a factor."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]  # two spawned processes
CASES = {"7 rows, token-mean": (7, "token-mean"), "5 rows, seq-mean": (5, "seq-mean-token-mean")}


def _gradients(tiny_dir: str, case: str, how: str | None, rank: int = 0, world: int = 1
               ) -> dict:
    """One optimizer step's gradients by parameter name (whole tensors) and its metrics."""
    from update_samples import random_samples

    from mgrpo.models import load_model
    from mgrpo.parallel.sharding import DataParallel, shard
    from mgrpo.training.config import LossConfig, ModelConfig
    from mgrpo.training.update import UpdateSpec, policy_update

    rows, agg = CASES[case]
    net, _ = load_model(tiny_dir)
    model = net if how is None else shard(net, how, "cpu")
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)  # after sharding: its parameters
    mcfg = ModelConfig(path=tiny_dir, micro_batch_size=2, grad_clip=1e9)
    metrics = policy_update(model, optimizer, random_samples(rows, seed=rows),
                            UpdateSpec(mcfg, LossConfig(agg=agg), pad_id=0, temperature=0.9),
                            generator=torch.Generator().manual_seed(0),
                            parallel=DataParallel(rank, world))
    grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
             .detach().clone() for name, p in net.named_parameters()}
    return {"grads": grads, "grad_norm": metrics["grad_norm"]}


def _rank(rank: int, tiny_dir: str, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    got = {(how, case): _gradients(tiny_dir, case, how, rank, 2)
           for how in ("fsdp", "ddp") for case in CASES}
    torch.save(got, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_ranks_gradients_equal_one_process(tiny_dir, tmp_path):
    from mgrpo.services.launcher import free_port

    port = free_port()
    mp.start_processes(_rank, args=(str(tiny_dir), port, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for case in CASES:
        one = _gradients(str(tiny_dir), case, None)
        largest = max(float(g.abs().max()) for g in one["grads"].values())
        assert largest > 1e-3, largest  # gradients to compare, not zeros
        for how in ("fsdp", "ddp"):
            for got in ranks:
                two = got[(how, case)]
                assert two["grads"].keys() == one["grads"].keys()
                diff = max(float((two["grads"][k] - g).abs().max())
                           for k, g in one["grads"].items())
                print(f"{how}, {case}: max |grad(2 ranks) - grad(1 process)| = {diff:.3g} "
                      f"(largest gradient {largest:.3g})")
                assert diff <= 1e-6, (how, case, diff)
                assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-6)
