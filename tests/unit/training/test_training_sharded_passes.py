"""The no-grad passes of a data-parallel update (pi_old of later mini-batches, the KL
reference) are split over the ranks: each rank runs its share of the micro-batches, then an
all-reduce gives every rank every row, equal to one process's pass. Two CPU gloo ranks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]  # two spawned processes


def _batch(vocab: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (7, 12), generator=gen)
    attention = torch.ones_like(ids)
    for row, n in enumerate([12, 9, 5, 12, 7, 3, 10]):
        attention[row, n:] = 0
    return {"input_ids": ids, "attention_mask": attention,
            "old_logprobs": torch.zeros(7, 12)}


def _rank(rank: int, tiny_dir: str, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from mgrpo.models import load_model
    from mgrpo.parallel.sharding import DataParallel
    from mgrpo.training.config import ModelConfig
    from mgrpo.training.update import no_grad_logprobs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model, _ = load_model(tiny_dir)
    rows_seen: list[int] = []
    model.register_forward_hook(lambda mod, args, kwargs, out: rows_seen.append(
        kwargs["input_ids"].shape[0]), with_kwargs=True)
    batch = _batch(model.config.vocab_size)
    mcfg = ModelConfig(path=tiny_dir, micro_batch_size=2)
    out = no_grad_logprobs(model, batch, torch.arange(7), mcfg, 0.8, DataParallel(rank, 2))
    torch.save({"out": out, "rows": rows_seen}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_each_rank_runs_its_share_and_all_get_every_row(tiny_dir, tmp_path):
    from mgrpo.models import load_model
    from mgrpo.services.launcher import free_port
    from mgrpo.training.config import ModelConfig
    from mgrpo.training.update import no_grad_logprobs

    port = free_port()
    mp.start_processes(_rank, args=(str(tiny_dir), port, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    model, _ = load_model(tiny_dir)
    batch = _batch(model.config.vocab_size)
    whole = no_grad_logprobs(model, batch, torch.arange(7), ModelConfig(
        path=str(tiny_dir), micro_batch_size=2), 0.8)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for got in ranks:
        assert torch.allclose(got["out"], whole, atol=1e-6)
    # 4 micro-batches of <= 2 rows: rank 0 runs 1 and 3, rank 1 runs 2 and 4 (7 rows in all)
    assert sum(ranks[0]["rows"]) + sum(ranks[1]["rows"]) == 7
    assert len(ranks[0]["rows"]) == len(ranks[1]["rows"]) == 2
