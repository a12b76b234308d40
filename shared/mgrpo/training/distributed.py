"""One model's policy update as a ``torchrun`` job of N ranks.

Why DDP and not FSDP2: ``torch.distributed.fsdp.fully_shard`` shards parameters over
DTensors; on this machine's CPU-only gloo build we use DistributedDataParallel, which every
backend supports, keeps a full model per rank (the tiny models fit anywhere) and gives the
single-process update up to float summation order. FSDP2 is the step for a model that does
not fit one device; it is not wired here.

- Rendezvous and backend: ``torchrun`` sets RANK / WORLD_SIZE / MASTER_ADDR; the backend is
  ``gloo`` on CPU, ``nccl`` when the device is CUDA.
- Samples: rank 0 alone reads them (here from a JSON file; in a service, from the store)
  and broadcasts them (``broadcast_object_list``), so every rank has the same samples in
  the same order; :func:`mgrpo.training.update.policy_update` with ``shard=(rank, world)``
  splits each mini-batch's micro-batches over the ranks.
- Checkpoint: rank 0 writes the same Hugging Face folder a single-process trainer writes
  (``mgrpo.models.checkpoint.save_checkpoint``: safetensors, manifest with sha256), from the
  unwrapped module; the other ranks wait at a barrier. Before it, every rank takes part in
  saving the optimizer state with ``torch.distributed.checkpoint`` (DCP) into
  ``v<version>.optim-dcp`` beside the version folder (each rank writes its share; with DDP
  the state is replicated and DCP keeps one copy).
- Resume (``--resume-version V``): every rank loads version V's weights (sha256 checked)
  and its DCP optimizer state (Adam moments and step), then trains version V + 1 from there.

Usage::

    torchrun --nproc-per-node 2 -m mgrpo.training.distributed --model DIR --samples S.json \\
        --out ROOT --name planner --version 1 [--resume-version 0] [--micro-batch-size 4]

``S.json``: ``[{"trajectory": {...Trajectory...}, "advantage": a, "reward": r}, ...]``.
Prints one JSON line (rank 0): ranks, update seconds (slowest rank), checkpoint URI, metrics.

What this module does NOT do: run inside the trainer service (that is
:mod:`mgrpo.services.trainer_ranks`, which also shards the parameters with FSDP2) or shard
parameters: this job is DDP only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def init(device: str = "cpu") -> tuple[int, int]:
    """Join the ``torchrun`` group (one process without torchrun: a group of one)."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size()


def broadcast_samples(samples: list | None) -> list:
    """Rank 0's ``samples`` on every rank, same order (the others pass None)."""
    box = [samples if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def read_samples(path: str) -> list:
    from mgrpo.training.scoring import Sample
    from mgrpo.types import Trajectory

    rows = json.loads(Path(path).read_text())
    return [Sample(Trajectory.model_validate(r["trajectory"]), float(r["advantage"]),
                   float(r["reward"])) for r in rows]


def optimizer_dcp_path(root: str, name: str, version: int) -> str:
    """Where version ``version``'s DCP optimizer state lives (beside its folder)."""
    return f"{root}/{name}/v{version:06d}.optim-dcp"


def save_optimizer(model, optimizer, path: str) -> None:
    """Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=path)


def load_optimizer(model, optimizer, path: str) -> None:
    """Collective: every rank calls it; fills ``optimizer`` (fresh) from ``path``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if not Path(path).is_dir():
        raise FileNotFoundError(f"no optimizer state at {path}: resume from a version this "
                                "module wrote, or start fresh without --resume-version")
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def update_and_save(args) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import load_checkpoint, save_checkpoint
    from mgrpo.training.config import LossConfig, ModelConfig
    from mgrpo.training.update import policy_update

    rank, world = init(args.device)
    samples = broadcast_samples(read_samples(args.samples) if rank == 0 else None)
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)[:2]
    if args.resume_version is not None:
        load_checkpoint(args.out, args.name, args.resume_version, model=model)
    model.to(args.device)
    ddp = DistributedDataParallel(model) if world > 1 else model
    mcfg = ModelConfig(path=args.model, lr=args.lr, micro_batch_size=args.micro_batch_size,
                       mini_batches=args.mini_batches)
    optimizer = torch.optim.Adam(model.parameters(), lr=mcfg.lr)
    if args.resume_version is not None:
        load_optimizer(ddp, optimizer,
                       optimizer_dcp_path(args.out, args.name, args.resume_version))
    dist.barrier()
    started = time.perf_counter()
    metrics = policy_update(ddp, optimizer, samples, mcfg, LossConfig(),
                            pad_id=tokenizer.pad_token_id,
                            generator=torch.Generator().manual_seed(args.seed),
                            shard=(rank, world))
    took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    save_optimizer(ddp, optimizer, optimizer_dcp_path(args.out, args.name, args.version))
    uri = None
    if rank == 0:
        uri = save_checkpoint(model, args.out, args.name, args.version, tokenizer=tokenizer,
                              extra={"ranks": world})
    dist.barrier()
    return {"ranks": world, "update_s": float(took), "uri": uri, "metrics": metrics}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--samples", required=True, help="JSON file of samples (rank 0 reads)")
    parser.add_argument("--out", required=True, help="checkpoint root")
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--resume-version", type=int, default=None,
                        help="start from this version's weights and DCP optimizer state")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--mini-batches", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        result = update_and_save(args)
        if dist.get_rank() == 0:
            print(json.dumps(result, sort_keys=True), flush=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
