"""A job for ``test_services_trainer_ranks_protocol``, run as ``torchrun --nproc-per-node 2
ranks_job.py TINY OUT STRATEGY ONE``: the trainer's rank protocol
(``mgrpo.parallel.ranks``) without the services. Rank 0 plays the service: ``load``
(the tiny folder), an ``update`` that fails on every rank before any collective (a KL
reference folder that does not exist), ``load`` again (as the trainer does before a
retry), a good ``update``, ``save`` (version 1 under ``OUT/ck``: optimizer shards by DCP,
gathered weights), ``load`` of that version (as a restarted job does), ``load`` of ``ONE``
(version 1 of a single-process trainer, its Adam state in ``.optimizer.pt``: a run that
resumes with more ranks), rank 0's engine asked to generate (refused under FSDP2), idle
heartbeats (every 0.2 s here) between the commands, ``stop``.
``STRATEGY``: fsdp or ddp. Every rank writes its weights and Adam state (its shards under
FSDP2) as it saved them to ``OUT/saved<r>.pt`` and after the n-th ``load`` (0: the folder,
1: the folder again, 2: the DCP checkpoint, 3: ``ONE``) to ``OUT/load<n>-<r>.pt``; rank 0
the metrics of the good update to ``OUT/metrics.json``."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, when run by torchrun
from update_samples import random_samples  # noqa: E402


def samples() -> list:
    """6 planner samples of random tokens (``update_samples.random_samples``)."""
    return random_samples(6)


def run_config(tiny: str, ref_path: str | None = None):
    """micro-batches of 2; with ``ref_path``: the KL term on, its reference there."""
    from mgrpo.training.config import RunConfig

    models = {m: {"path": tiny, "lr": 1e-3, "micro_batch_size": 2} for m in
              ("planner", "searcher", "coder")}
    models["planner"]["ref_path"] = ref_path
    return RunConfig.model_validate({"name": "job", "k": 2, "models": models,
                                     "loss": {"kl_coef": 0.1 if ref_path else 0.0}})


def local_state(lm) -> dict:
    """This rank's weights and Adam state by parameter name (FSDP2: its shards)."""
    def local(t):
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

    names = {id(p): n for n, p in lm.model.named_parameters()}
    optim = {names[id(p)]: {k: local(v) for k, v in s.items()}
             for p, s in lm.optimizer.state.items()}
    return {"weights": {k: local(v) for k, v in lm.model.state_dict().items()}, "optim": optim}


def main(tiny: str, out: str, how: str, one: str) -> None:
    from mgrpo.config import Settings
    from mgrpo.parallel import checkpoint
    from mgrpo.parallel import ranks as rank_protocol
    from mgrpo.services.trainer.ranks import follower_model, trainer_work
    from mgrpo.training.rounds import update_model

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    rank_protocol.HEARTBEAT_S = 0.2
    ranks = rank_protocol.Ranks("cpu", trainer_work())
    good = run_config(tiny)
    lm = follower_model(Settings(), good, "planner")
    ranks.wrap(lm.model, how)
    save = checkpoint.save

    def save_and_record(lm, *args):  # what every rank held when it saved
        torch.save(local_state(lm), f"{out}/saved{ranks.rank}.pt")
        return save(lm, *args)

    checkpoint.save = save_and_record
    put, loads = rank_protocol.Ranks.put, []

    def put_and_record(self, lm, lr, checkpoint, source):  # every rank, after each load
        moments = put(self, lm, lr, checkpoint, source)
        torch.save(local_state(lm), f"{out}/load{len(loads)}-{ranks.rank}.pt")
        loads.append(moments)
        return moments

    rank_protocol.Ranks.put = put_and_record
    if ranks.rank > 0:
        ranks.follow(lm)
    else:
        ranks.lead(lm)
        try:  # an llm judge on the trained model: rank 0 alone cannot run a sharded one
            lm.engine.generate([])
            print("rank 0: generate ran", flush=True)
        except RuntimeError as error:
            print(f"rank 0: generate refused: {error}", flush=True)
        ranks.load(lm, 1e-3, None, tiny)
        time.sleep(1.0)  # heartbeats meanwhile
        try:
            update_model(lm, samples(), run_config(tiny, ref_path=f"{out}/missing"), 0)
            raise AssertionError("the update with a missing reference did not fail")
        except AssertionError:
            raise
        except Exception as error:  # noqa: BLE001 - what the trainer would count
            print(f"rank 0: update failed as expected: {type(error).__name__}", flush=True)
        ranks.load(lm, 1e-3, None, tiny)
        time.sleep(1.0)
        metrics = update_model(lm, samples(), good, 0)
        with open(f"{out}/metrics.json", "w") as handle:
            json.dump(metrics, handle)
        uri = ranks.save(lm, f"{out}/ck", 1, {"round_id": "r"})
        print(f"rank 0: saved {uri}", flush=True)
        moments = ranks.load(lm, 1e-3, (uri, 1), tiny)  # a restart: a fresh Adam + DCP
        print(f"rank 0: reloaded, moments restored: {moments}", flush=True)
        moments = ranks.load(lm, 1e-3, (one, 1), tiny)  # a single process's checkpoint
        print(f"rank 0: loaded the single process's v1, moments restored: {moments}",
              flush=True)
        time.sleep(1.0)
        ranks.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
