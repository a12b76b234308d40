"""The embedded loop's optimizer state is the trainer service's format: ``.optimizer.pt``
beside each version, vouched for by the manifest's sha256. A round trip restores the same
moments; a corrupted or swapped file is refused in one line; uncommitted and pruned versions
lose their optimizer files with them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


def _system(tmp_path, tiny_dir, keep: int = 3, steps: int = 1):
    from mgrpo.models import load_model

    model, tokenizer = load_model(tiny_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.tensor([[5, 17, 33, 2]])).logits.sum().backward()
        optimizer.step()
    lm = SimpleNamespace(name="planner", model=model, tokenizer=tokenizer, optimizer=optimizer,
                         version=0, engine=SimpleNamespace(model=model, version=0))
    cfg = SimpleNamespace(name="r", out_dir=str(tmp_path / "run"), keep_checkpoints=keep,
                          init_from=None)
    return SimpleNamespace(cfg=cfg, models={"planner": lm})


def _folder(system) -> Path:
    return Path(system.cfg.out_dir) / "checkpoints" / "r" / "planner"


def test_a_round_trip_restores_identical_optimizer_state(tmp_path, tiny_dir):
    from mgrpo.training.run_state import save_state, start_weights

    saved = _system(tmp_path, tiny_dir)
    save_state(saved, 0)
    folder = _folder(saved)
    assert sorted(p.name for p in folder.iterdir()) == ["v000001", "v000001.optimizer.pt"]
    entry = json.loads((folder / "v000001" / "manifest.json").read_text())["extra"]["optimizer"]
    assert entry["file"] == "v000001.optimizer.pt"
    assert entry["size"] == (folder / "v000001.optimizer.pt").stat().st_size

    resumed = _system(tmp_path, tiny_dir, steps=0)
    assert start_weights(resumed, resume=True) == 1
    before = saved.models["planner"].optimizer.state_dict()
    after = resumed.models["planner"].optimizer.state_dict()
    assert before["param_groups"] == after["param_groups"]
    assert before["state"].keys() == after["state"].keys()
    for index, state in before["state"].items():
        for key, value in state.items():
            assert torch.equal(value, after["state"][index][key]), (index, key)


def test_a_corrupted_or_swapped_optimizer_file_is_refused(tmp_path, tiny_dir):
    from mgrpo.parallel.optimizer_state import OptimizerStateError
    from mgrpo.training.run_state import save_state, start_weights

    system = _system(tmp_path, tiny_dir)
    save_state(system, 0)
    target = _folder(system) / "v000001.optimizer.pt"
    good = target.read_bytes()
    torn = bytearray(good)
    torn[-1] ^= 0xFF
    target.write_bytes(bytes(torn))
    with pytest.raises(OptimizerStateError, match=r"is corrupted \(sha256 .*do not resume") as bad:
        start_weights(_system(tmp_path, tiny_dir, steps=0), resume=True)
    assert "\n" not in str(bad.value)

    other = _system(tmp_path, tiny_dir, steps=2).models["planner"].optimizer  # a valid file
    torch.save(other.state_dict(), target)  # of another state, under this manifest
    with pytest.raises(OptimizerStateError, match="is corrupted"):
        start_weights(_system(tmp_path, tiny_dir, steps=0), resume=True)

    target.unlink()
    with pytest.raises(OptimizerStateError, match="is named by the manifest .* but missing"):
        start_weights(_system(tmp_path, tiny_dir, steps=0), resume=True)


def test_uncommitted_and_pruned_versions_lose_their_optimizer_files(tmp_path, tiny_dir):
    from mgrpo.training.run_state import clean_uncommitted, save_state

    system = _system(tmp_path, tiny_dir, keep=1)
    save_state(system, 0)
    save_state(system, 1)
    folder = _folder(system)
    assert sorted(p.name for p in folder.iterdir()) == ["v000002", "v000002.optimizer.pt"]

    (folder / "v000003.optimizer.pt").write_bytes(b"a killed round's")
    (folder / "v000003.optimizer.pt.tmp-0000beef").write_bytes(b"torn")
    removed = clean_uncommitted(system.cfg, ["planner"])
    assert sorted(removed) == ["planner/v000003.optimizer.pt",
                               "planner/v000003.optimizer.pt.tmp-0000beef"]
    assert sorted(p.name for p in folder.iterdir()) == ["v000002", "v000002.optimizer.pt"]
