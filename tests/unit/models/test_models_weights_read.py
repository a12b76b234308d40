"""A sampler's reload (mgrpo.models.weights_read): the same tensors as the sha256 reader,
crc32-checked, and after a sync the engine's logprobs are the trainer model's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.models import load_model
from mgrpo.models.checkpoint import CheckpointError, read_checkpoint_dir, save_checkpoint
from mgrpo.models.logprobs import token_logprobs
from mgrpo.models.weights_read import read_weights


def _moved(model) -> torch.nn.Module:
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i % 5 + 1))
    return model


def _engine_agrees(engine: TorchEngine, model) -> None:
    """Greedy continuation sampled by ``engine``: its logprobs are ``model``'s (1e-5)."""
    prompt = [5, 9, 14, 3, 7]
    (out,) = engine.generate([GenerationRequest(prompt, SamplingParams(
        temperature=0.0, max_new_tokens=6))])
    ids = torch.tensor([prompt + out.completion_ids])
    with torch.no_grad():
        trainer = token_logprobs(model, ids)[0, len(prompt):]
    assert torch.allclose(torch.tensor(out.logprobs), trainer.float(), atol=1e-5)


def test_fast_read_is_the_sha256_reader_and_the_engine_samples_the_trainer(tiny, tiny_dir,
                                                                           tmp_path):
    model, tok = tiny
    trainer = _moved(model)
    uri = save_checkpoint(trainer, str(tmp_path), "planner", 1, tokenizer=tok)
    fast, manifest = read_weights(uri)
    slow, _ = read_checkpoint_dir(uri)
    assert manifest["files"]["model.safetensors"]["crc32"] >= 0
    assert fast.keys() == slow.keys()
    assert all(torch.equal(fast[k], slow[k]) and fast[k].dtype == slow[k].dtype for k in slow)
    sampler_model, _ = load_model(tiny_dir)
    engine = TorchEngine(sampler_model, tok)
    engine.load_weights(uri, 1)
    assert engine.version == 1 and engine.model is sampler_model  # in place, same module
    _engine_agrees(engine, trainer)


def test_embedded_sync_copies_the_trainer_tensors_in_place(tiny, tiny_dir, tmp_path):
    from mgrpo.training.run_state import sync_sampler

    model, tok = tiny
    sampler_model, _ = load_model(tiny_dir)
    engine = TorchEngine(sampler_model, tok)
    params = [p.data_ptr() for p in sampler_model.parameters()]
    lm = SimpleNamespace(model=_moved(model), engine=engine, version=3)
    sync_sampler(lm, str(tmp_path / "not-read"))  # no checkpoint read: the uri is absent
    assert engine.version == 3
    assert [p.data_ptr() for p in sampler_model.parameters()] == params
    _engine_agrees(engine, lm.model)


@pytest.mark.parametrize("damage", ["flip", "truncate", "append", "remove"])
def test_a_damaged_weights_file_is_refused(tiny, tmp_path, damage):
    model, _ = tiny
    uri = save_checkpoint(model, str(tmp_path), "planner", 1)
    path = Path(uri, "model.safetensors")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-4]))
    elif damage == "append":
        path.write_bytes(bytes(data) + b"\0")
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match="corrupted \\(crc32|missing"):
        read_weights(uri)


def test_a_manifest_without_crc32_is_read_by_its_sha256(tiny, tmp_path):
    model, _ = tiny
    uri = save_checkpoint(model, str(tmp_path), "planner", 1)
    manifest_path = Path(uri, "manifest.json")
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["files"].values():
        del entry["crc32"]
    manifest_path.write_text(json.dumps(manifest))
    state, _ = read_weights(uri)
    assert torch.equal(state["model.norm.weight"], model.state_dict()["model.norm.weight"])
    path = Path(uri, "model.safetensors")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        read_weights(uri)
