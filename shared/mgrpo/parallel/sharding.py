"""How one model is split over the ranks of a data-parallel job (torchtitan's
``parallelize`` step): FSDP2 or DDP, chosen by ``MGRPO_TRAINER_STRATEGY``.

- ``fsdp`` (default) shards every decoder layer and the root with FSDP2
  (``torch.distributed.fsdp.fully_shard``): each rank holds 1/N of the parameters, gradients
  and Adam moments. It runs on gloo (CPU) with this torch, tested.
- ``ddp`` keeps a whole replica per rank (``DistributedDataParallel``): chosen by hand, and
  used for a LoRA model (its trainable adapter is tiny; FSDP2 over peft's frozen base is not
  tested here), whose ``fsdp`` is refused with a one-line error.

The frozen KL reference of an FSDP2 job is sharded with the same :func:`shard`
(:mod:`mgrpo.training.reference`).

What this module does NOT do: start the process group (:mod:`mgrpo.parallel.ranks`) or move
weights and optimizer state in and out (:mod:`mgrpo.parallel.checkpoint`).
"""

from __future__ import annotations

import torch

from mgrpo.models.checkpoint import dedupe_tied

STRATEGIES = ("fsdp", "ddp")


def strategy(explicit: str | None, lora: bool) -> str:
    """``MGRPO_TRAINER_STRATEGY`` (``explicit``; unset: ``fsdp``, or ``ddp`` for LoRA)."""
    if explicit is None:
        return "ddp" if lora else "fsdp"
    if explicit not in STRATEGIES:
        raise ValueError(f"MGRPO_TRAINER_STRATEGY={explicit!r} is not one of "
                         f"{', '.join(STRATEGIES)}")
    if explicit == "fsdp" and lora:
        raise ValueError("MGRPO_TRAINER_STRATEGY=fsdp with a LoRA model is not supported; "
                         "use ddp (the default for LoRA)")
    return explicit


def tied_aliases(model: torch.nn.Module) -> tuple[list[str], dict[str, str]]:
    """The plain model's state-dict keys in order and its tied keys ({dropped: kept}), read
    BEFORE sharding (a gathered full state dict holds tied weights as separate copies)."""
    state = model.state_dict()
    return list(state), dedupe_tied(state)[1]


def shard(model: torch.nn.Module, how: str, device: str) -> torch.nn.Module:
    """FSDP2 in place (returns ``model``) or a DDP wrapper; collective."""
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device).index] if device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to shard with FSDP2; "
                         "use MGRPO_TRAINER_STRATEGY=ddp")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
