"""The one checkpoint format at world size 1 (``mgrpo.parallel.checkpoint``): a process group
of one saves the optimizer state with DCP beside the Hugging Face folder, the manifest vouches
for it with a digest, the one loader restores Adam exactly into a fresh optimizer, and a
changed byte in the DCP folder is refused in one line instead of resuming from it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from mgrpo.services.launcher import free_port


@pytest.fixture
def group_of_one():
    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_world_size_one_saves_and_loads_the_same_format(tmp_path, tiny, group_of_one):
    from mgrpo.parallel import checkpoint
    from mgrpo.parallel.optimizer_state import OptimizerStateError
    from mgrpo.parallel.sharding import tied_aliases

    model, tokenizer = tiny[:2]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.tensor([[5, 17, 33, 2]])).logits.sum().backward()
    optimizer.step()
    lm = SimpleNamespace(name="planner", model=model, optimizer=optimizer, tokenizer=tokenizer)
    root = str(tmp_path / "ck")
    uri = checkpoint.save(lm, root, 1, checkpoint.temp_name(1), {"round": 0},
                          tied_aliases(model))
    entry = checkpoint.optimizer_entry(uri)
    assert (entry["format"], entry["ranks"], len(entry["sha256"])) == ("dcp", 1, 64)
    assert Path(checkpoint.dcp_uri(uri).removeprefix("file://")).is_dir()

    fresh = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert checkpoint.load_optimizer(model, fresh, uri)
    for p in model.parameters():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(fresh.state[p][key], optimizer.state[p][key]), key

    folder = Path(checkpoint.dcp_uri(uri).removeprefix("file://"))
    shard = next(f for f in sorted(folder.iterdir()) if f.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(OptimizerStateError, match=r"is corrupted \(sha256 .*do not resume"):
        checkpoint.load_optimizer(model, torch.optim.Adam(model.parameters(), lr=1e-2), uri)
