"""How one model is split over the ranks of a data-parallel job and how its gradients are
reduced (torchtitan's ``parallelize`` step): FSDP2 or DDP, chosen by
``MGRPO_TRAINER_STRATEGY``, and :class:`DataParallel`, the rank's place that an update runs by.

Gradients are SUMMED over the ranks, never averaged: FSDP2's divide factor is 1 with sum-only
collectives (``set_gradient_divide_factor(1.0)``, ``set_force_sum_reduction_for_comms``), and
DDP all-reduces through a summing comm hook. So a rank weights each of its micro-batch losses
by that micro-batch's share of the whole mini-batch, exactly as one process does, and the sum
over the ranks is the single process's gradient; no loss is scaled by the world size.

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

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist

from mgrpo.models.checkpoint import dedupe_tied

STRATEGIES = ("fsdp", "ddp")
T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """Rank ``rank`` of ``world`` in a data-parallel update: every rank holds the same samples
    in the same order and runs the micro-batches ``rank, rank + world, ...`` of each
    mini-batch; its model was sharded by :func:`shard` (gradients summed over the ranks).
    ``wrapper``: the DDP wrapper :func:`shard` returned (None under FSDP2, which shards the
    model in place, and in one process). ``DataParallel()`` is one process."""

    rank: int = 0
    world: int = 1
    wrapper: torch.nn.Module | None = field(default=None, compare=False, repr=False)

    def module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module an update runs for ``model``: its DDP wrapper, else ``model``."""
        return model if self.wrapper is None else self.wrapper

    def fsdp(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is sharded over the ranks by FSDP2 (its reference must be too)."""
        return self.world > 1 and is_sharded(model)

    def mine(self, parts: Sequence[T]) -> Sequence[T]:
        """This rank's share of ``parts``: every ``world``-th, from ``rank``."""
        return parts[self.rank::self.world]

    def passes(self, parts: Sequence) -> int:
        """How many passes every rank makes over ``parts`` (a rank short of one pads: DDP's
        and FSDP2's forwards and backwards are collective)."""
        return -(-len(parts) // self.world)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, in place (nothing with one rank)."""
        if self.world > 1:
            dist.all_reduce(tensor)
        return tensor

    @contextmanager
    def accumulating(self, model: torch.nn.Module, last: bool) -> Iterator[None]:
        """Around a micro-batch's forward and backward: DDP reduces gradients only on the
        ``last`` one of an optimizer step (``no_sync`` before it); FSDP2 reduce-scatters
        after every backward (its gradients stay sharded), one process never reduces."""
        no_sync = getattr(model, "no_sync", None)
        if self.world == 1 or last or no_sync is None:
            yield
        else:
            with no_sync():
                yield


SINGLE = DataParallel()


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


def _sum_bucket(group, bucket):  # no annotations: DDP checks them against the real types
    """DDP comm hook: all-reduce a gradient bucket (a ``dist.GradBucket``) by sum (DDP's
    own hook divides by the world size first); returns the reduced buffer's future."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


def shard(model: torch.nn.Module, how: str, device: str) -> torch.nn.Module:
    """FSDP2 in place (returns ``model``) or a DDP wrapper, each summing its gradients over
    the ranks; collective."""
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device).index] if device.startswith("cuda") else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
        wrapped.register_comm_hook(None, _sum_bucket)
        return wrapped
    from torch.distributed.fsdp import FSDPModule, fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to shard with FSDP2; "
                         "use MGRPO_TRAINER_STRATEGY=ddp")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():  # each fully_shard unit reduces its own parameters
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
