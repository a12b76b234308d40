"""A job for ``test_training_ref_shard``, run as ``torchrun --nproc-per-node N
ref_shard_job.py TINY REF OUT``: one KL-on policy update (:func:`mgrpo.training.rounds.
local_update`, ``parallel=DataParallel(rank, N)``) of the FSDP2-sharded policy in ``TINY``
against the reference in ``REF``, as a rank of the trainer's job runs it
(:func:`update_once`; the test calls it in its own process for the single-process update).
Every rank writes
``OUT/rank<r>.pt``: the rows each no-grad forward of the reference and of the policy
(pi_old) ran, the reference's parameters on the rank (numel, whether DTensors) and,
gathered, the policy's weights after the update and the metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, when run by torchrun
from update_samples import random_samples  # noqa: E402


def samples() -> list:
    """8 planner samples of random tokens (``update_samples.random_samples``)."""
    return random_samples(8)


def run_config(tiny: str, ref: str):
    """KL in the loss (k3+, coefficient 0.5) against ``ref``; 2 mini-batches of 4 rows,
    micro-batches of 2 (so pi_old of the second mini-batch is a separate no-grad pass)."""
    from mgrpo.training.config import RunConfig

    models = {m: {"path": tiny, "lr": 1e-3} for m in ("searcher", "coder")}
    models["planner"] = {"path": tiny, "ref_path": ref, "lr": 1e-3, "micro_batch_size": 2,
                         "mini_batches": 2}
    return RunConfig.model_validate({"name": "refshard", "k": 2, "models": models,
                                     "loss": {"kl_coef": 0.5, "kl_estimator": "k3+"}})


def update_once(tiny: str, ref_dir: str, rank: int = 0, world: int = 1) -> dict:
    """This rank's update (``world`` 1: the single process, no process group) and what it
    saw: the rows of each no-grad forward, the reference's local numel, the gathered
    weights and the metrics."""
    from mgrpo.models import load_model
    from mgrpo.parallel.sharding import DataParallel, shard
    from mgrpo.training.precision import make_optimizer
    from mgrpo.training.reference import reference_for
    from mgrpo.training.rounds import local_update
    from mgrpo.training.system import LoadedModel

    cfg = run_config(tiny, ref_dir)
    mcfg = cfg.models["planner"]
    net, tokenizer = load_model(tiny)
    if world > 1:
        shard(net, "fsdp", "cpu")
    lm = LoadedModel("planner", net, tokenizer, None, make_optimizer(net, mcfg))
    # The reference local_update will use (built here first, so its forwards can be counted).
    ref = reference_for(lm, mcfg, cfg.loss, run_id=cfg.name, sharded=world > 1)
    seen: dict[str, list[int]] = {"ref": [], "pi_old": []}
    ref.register_forward_hook(lambda mod, args, kwargs, res: seen["ref"].append(
        kwargs["input_ids"].shape[0]), with_kwargs=True)
    net.register_forward_hook(lambda mod, args, kwargs, res: None if torch.is_grad_enabled()
                              else seen["pi_old"].append(kwargs["input_ids"].shape[0]),
                              with_kwargs=True)
    metrics = local_update(lm, samples(), cfg, 0, parallel=DataParallel(rank, world))
    assert lm.ref_model is ref, "local_update built another reference"
    weights = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
               for name, p in net.named_parameters()}
    ref_params = list(ref.parameters())
    return {"seen": seen, "weights": weights, "metrics": metrics,
            "ref_numel": sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                             for p in ref_params),
            "ref_dtensor": all(hasattr(p, "to_local") for p in ref_params)}


def main(tiny: str, ref_dir: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.save(update_once(tiny, ref_dir, rank, world), f"{out}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
