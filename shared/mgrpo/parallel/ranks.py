"""The rank protocol: one model's trainer as a ``torchrun`` job of N ranks, data-parallel
updates over N processes with FSDP2 (default) or DDP, everything else exactly as the
single-process trainer.

    torchrun --nproc-per-node N -m mgrpo.cli.main serve trainer --model M

With ``WORLD_SIZE`` unset or 1 nothing here runs: ``mgrpo.services.entrypoints.serve_trainer``
takes the single-process path, which loads and saves through the same
:mod:`mgrpo.parallel.checkpoint` format.

- **Rank 0 is the trainer service**
  (:class:`mgrpo.services.trainer.service.TrainerService`): it holds the lease
  ``trainer:<model>``, consumes ``trainer.<model>``, ingests into the store, waits
  for rounds, computes rewards, group statistics and advantages, writes the checkpoint and
  publishes, and serves /healthz and /metrics. Ranks 1..N-1 (:func:`follow`) touch neither
  the store nor the broker: they hold their part of the model (its shards under FSDP2, a
  replica under DDP) and wait for rank 0's commands.
  Why one reader, not "every rank reads its share from the store": the samples of a round
  are a few thousand rows at most, far less than one gradient all-reduce, while N readers
  would each need the store, the round's readiness decision and the rewards (judges, maybe
  an LLM) to agree bit for bit; broadcasting rank 0's samples gives every rank the same
  samples in the same order by construction.
- **Backends**: gloo on CPU; on GPUs ``cpu:gloo,cuda:nccl`` (NCCL for the gradients, gloo
  for the CPU tensors the update all-reduces: its metrics). Not run here (no multi-GPU
  machine): only CPU gloo is tested.
- **Commands** (``broadcast_object_list`` from rank 0 on a gloo group: the default group on
  CPU, a separate gloo group on GPUs): ``load`` (a fresh Adam and the weights
  and optimizer state of a recorded checkpoint, or the initial folder: every rank reads the
  same files, so the checkpoint store must be shared, as it is for the workers), ``update``
  (the samples, the round's config and index: every rank runs
  :func:`mgrpo.training.rounds.update_model` on its part with ``parallel=DataParallel(rank,
  N)``: :mod:`mgrpo.parallel.sharding`),
  ``save`` (a collective checkpoint: :func:`mgrpo.parallel.checkpoint.save`),
  ``idle`` (a heartbeat every :data:`HEARTBEAT_S` so the followers' wait never reaches the
  process group's timeout; rank 0 also ends itself there if its torchrun agent is gone)
  and ``stop``. One lock orders them with the update's own collectives.
- **Strategy** (``MGRPO_TRAINER_STRATEGY``, :mod:`mgrpo.parallel.sharding`): FSDP2
  (``fully_shard``) by default, since it runs on gloo CPU with this torch (tested: the
  same weights as one process within 1e-6); DDP when chosen, and for a LoRA model. Under
  FSDP2 rank 0 cannot run the model alone, so an llm judge on the trained model itself
  fails the round with a one-line error naming ``ddp`` (a judge on another model, or rule
  judges, are unaffected).
- **Checkpoint**: the single-process trainer's folder (safetensors, manifest with sha256),
  written by rank 0 from the gathered full weights; the optimizer state saved sharded by
  ``torch.distributed.checkpoint`` beside it (``v<version>.optim-dcp``), restored sharded
  on restart with any number of ranks (one process too).
- **Failures**: an error in an update is logged on every rank that raised it; rank 0 counts
  it as the single-process trainer does and reloads every rank from the store before the
  retry (``load``). A rank that dies, or a collective that fails, ends the job: torchrun
  stops the other ranks, and whatever restarts the job (the pod, compose) resumes from the
  store's newest checkpoint, as after any trainer kill.

- **The work** (:class:`RankWork`): what ``load`` and ``update`` do with the model is the
  trainer's (``mgrpo.services.trainer.ranks.trainer_work``): this room runs the commands, it
  does not know the training.

What this module does NOT do: train on several nodes by itself (torchrun's c10d rendezvous
does that: docs/deploy.md), or shard beyond one FSDP2 mesh dimension (no tensor parallel).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from mgrpo.parallel import checkpoint as ckpt
from mgrpo.parallel import sharding

log = logging.getLogger(__name__)
SHARDED_GENERATE = ("the trainer's model is sharded over its ranks (FSDP2): rank 0 cannot "
                    "generate with it alone (an llm judge on the trained model); run this "
                    "trainer with MGRPO_TRAINER_STRATEGY=ddp")
HEARTBEAT_S = 10.0  # rank 0 says "idle" this often when it sends nothing else
TIMEOUT_S = 1800.0  # a collective waiting this long fails (a rank is stuck or gone)
CLOSE_S = 30.0  # at stop, a rank waits this long for the others before leaving the group


def world_size() -> int:
    """torchrun's ``WORLD_SIZE`` (1 when unset: the single-process trainer)."""
    return int(os.environ.get("WORLD_SIZE", "1") or "1")


def torchrun_argv(nproc: int, model: str) -> list[str]:
    """``mgrpo serve trainer --model M`` as a one-node torchrun job of ``nproc`` ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "mgrpo.cli.main", "serve", "trainer",
            "--model", model]


class RankWork(NamedTuple):
    """What a rank does with its model, given by the trainer that runs the job."""

    put_state: Callable[..., bool]  # (lm, lr, checkpoint, source): a replica's weights + Adam
    fresh_optimizer: Callable[..., torch.optim.Optimizer]  # (previous, model, lr): no moments
    update: Callable[..., dict[str, float]]  # (lm, samples, cfg, round_index, parallel=)


class Ranks:
    """This process's place in the trainer job: rank, world, device and the command group."""

    def __init__(self, device: str, work: RankWork) -> None:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device.startswith("cuda"):
            self.device = f"cuda:{local}" if device == "cuda" else device
            torch.cuda.set_device(self.device)
            backend = "cpu:gloo,cuda:nccl"  # the update's few CPU all-reduces go to gloo
        else:
            self.device, backend = device, "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=TIMEOUT_S))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.parallel = sharding.DataParallel(self.rank, self.world)
        self.group = dist.new_group(backend="gloo") if backend != "gloo" else None
        self.work = work
        self.lock = threading.Lock()
        self.strategy, self.tied = "ddp", ([], {})  # set by wrap()
        self._stop = threading.Event()

    def wrap(self, model: torch.nn.Module, how: str) -> None:
        """Shard the model with FSDP2 or wrap it in DDP (``how``; collective: every rank,
        same model). See :mod:`mgrpo.parallel.sharding`."""
        self.strategy = how
        self.tied = sharding.tied_aliases(model)  # before sharding
        wrapped = sharding.shard(model, how, self.device)
        if how == "ddp":  # FSDP2 shards the module in place
            self.parallel = sharding.DataParallel(self.rank, self.world, wrapper=wrapped)
        log.info("trainer rank %d/%d: %s", self.rank, self.world,
                 "FSDP2 (fully_shard per decoder layer and root)" if how == "fsdp" else "DDP")

    def put(self, lm, lr: float, checkpoint: tuple[str, int] | None, source: str) -> bool:
        """This rank's weights and a fresh Adam with the checkpoint's optimizer state (the
        single-process ``work.put_state`` under DDP)."""
        if self.strategy == "ddp":
            return self.work.put_state(lm, lr, checkpoint, source)
        if lm.optimizer is not None:  # None: a frozen model's trainer (it never updates)
            lm.optimizer = self.work.fresh_optimizer(lm.optimizer, lm.model, lr)
        ckpt.load_weights(lm, checkpoint, source, self.tied)
        return checkpoint is not None and lm.optimizer is not None and \
            ckpt.load_optimizer(lm.model, lm.optimizer, checkpoint[0])

    # -- rank 0 ---------------------------------------------------------------------------
    def send(self, command: str, *args) -> None:
        """Rank 0: one command to every other rank (hold :attr:`lock`)."""
        box = [(command, args)]
        dist.broadcast_object_list(box, src=0, group=self.group)

    def lead(self, lm) -> None:
        """Rank 0: make ``lm`` (the service's model) send its loads and updates to every
        rank, and start the heartbeat."""
        lm.ranks = self
        if self.strategy == "fsdp":  # rank 0 alone cannot run a sharded model's forward
            lm.engine.refuse_generation(SHARDED_GENERATE)
        threading.Thread(target=self._heartbeat, name="trainer-ranks-heartbeat",
                         daemon=True).start()

    def _heartbeat(self) -> None:
        parent = os.getppid()  # torchrun's agent
        while not self._stop.wait(HEARTBEAT_S):
            if os.getppid() != parent:  # the agent was killed: no one would stop this rank
                log.error("trainer ranks: torchrun (pid %d) is gone; ending this rank", parent)
                logging.shutdown()
                os._exit(1)
            try:
                with self.lock:
                    if not self._stop.is_set():
                        self.send("idle")
            except Exception:  # noqa: BLE001 - the group is broken: end the job (see above)
                log.exception("trainer ranks: heartbeat failed; ending this rank")
                logging.shutdown()
                os._exit(1)

    def load(self, lm, lr: float, checkpoint: tuple[str, int] | None, source: str) -> bool:
        """Rank 0: every rank puts the same weights and optimizer state in (see
        :meth:`put`). Returns whether moments were restored."""
        with self.lock:
            self.send("load", lr, checkpoint, source)
            return self.put(lm, lr, checkpoint, source)

    def save(self, lm, root: str, version: int, extra: dict) -> str:
        """Rank 0 (called by ``mgrpo.services.trainer.weights``' ``save_checkpoint``): every
        rank saves its optimizer shard (DCP), rank 0 the gathered weights; returns the
        version's URI."""
        tmp = ckpt.temp_name(version)
        with self.lock:
            self.send("save", root, version, tmp)
            return ckpt.save(lm, root, version, tmp, extra, self.tied)

    def update(self, lm, samples: list, cfg, round_index: int) -> dict[str, float]:
        """Rank 0 (called by :func:`mgrpo.training.rounds.update_model`): the round's update
        on every rank, rank 0's samples broadcast."""
        with self.lock:
            self.send("update", samples, cfg, round_index)
            return self.work.update(lm, samples, cfg, round_index, parallel=self.parallel)

    def stop(self) -> None:
        """Rank 0: tell the other ranks to exit (skipped if an update holds the lock), then
        leave the process group."""
        self._stop.set()
        if self.lock.acquire(timeout=5):
            try:
                self.send("stop")
                self.close()
            except Exception as error:  # noqa: BLE001 - they exit on the broken group
                log.info("trainer ranks: stop not sent, the other ranks are gone (%s)",
                         str(error)[:200])
            finally:
                self.lock.release()

    def close(self) -> None:
        """Every rank, after ``stop``: wait (at most :data:`CLOSE_S`) until every rank got
        there, then destroy the process group. A process that exits with a live gloo group
        can abort in the interpreter's finalisation (SIGABRT, "terminate called without an
        active exception": gloo's threads still hold tensors; pytorch/pytorch#190489), which
        torchrun reports as a failed job."""
        try:
            dist.monitored_barrier(group=self.group, timeout=timedelta(seconds=CLOSE_S))
        except Exception as error:  # noqa: BLE001 - a rank is gone: leave anyway
            log.info("trainer rank %d: closing without the other ranks (%s)", self.rank,
                     str(error)[:200])
        dist.destroy_process_group()

    # -- ranks 1..N-1 ---------------------------------------------------------------------
    def follow(self, lm) -> None:
        """Ranks > 0: carry out rank 0's commands until ``stop``."""
        log.info("trainer rank %d/%d of %s waits for rank 0", self.rank, self.world, lm.name)
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=self.group)
            command, args = box[0]
            if command == "stop":
                log.info("trainer rank %d: stop", self.rank)
                self.close()
                return
            if command == "load":
                self.put(lm, *args)
            elif command == "save":
                root, version, tmp = args
                ckpt.save(lm, root, version, tmp, None, self.tied)
            elif command == "update":
                samples, cfg, round_index = args
                try:
                    self.work.update(lm, samples, cfg, round_index, parallel=self.parallel)
                except Exception:  # noqa: BLE001 - rank 0 counts it and reloads every rank
                    log.exception("trainer rank %d: update of round %d failed", self.rank,
                                  round_index)
            elif command != "idle":
                raise ValueError(f"trainer rank {self.rank}: unknown command {command!r}")

