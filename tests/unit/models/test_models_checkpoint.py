from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import fsspec
import pytest
import torch

from mgrpo.models import (
    CheckpointError,
    latest_version,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from mgrpo.models.checkpoint import (
    clean_leftovers,
    discard_version,
    list_versions,
    read_checkpoint_dir,
)


def _perturbed(model, scale=0.01, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


@pytest.mark.parametrize("scheme", ["local", "file", "memory"])
def test_round_trip_restores_every_tensor(tiny, tiny_dir, tmp_path, scheme, unique_name):
    model, tok = tiny
    root = {"local": str(tmp_path / "ck"), "file": f"file://{tmp_path}/ck",
            "memory": f"memory://{unique_name}"}[scheme]
    _perturbed(model)
    uri = save_checkpoint(model, root, "planner", 3, tokenizer=tok, extra={"round": 7})
    assert uri.endswith("/planner/v000003")
    assert latest_version(root, "planner") == 3
    fresh, _ = load_model(tiny_dir)
    loaded, manifest = load_checkpoint(root, "planner", model=fresh)
    assert manifest["version"] == 3 and manifest["extra"] == {"round": 7}
    assert manifest["kind"] == "full"
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    # tied embeddings stay tied after loading
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_full_checkpoint_is_a_loadable_hf_folder(tiny, tmp_path):
    model, tok = tiny
    uri = save_checkpoint(_perturbed(model), str(tmp_path), "coder", 1, tokenizer=tok)
    again, tok2 = load_model(uri)
    ids = torch.tensor([[5, 6, 7]])
    assert torch.allclose(again(ids).logits, model(ids).logits, atol=1e-6)
    assert len(tok2) == len(tok)


def test_flipped_byte_raises_checkpoint_error(tiny, tmp_path):
    model, _ = tiny
    uri = save_checkpoint(model, str(tmp_path), "planner", 1)
    path = Path(uri) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(str(tmp_path), "planner", 1)


def test_existing_version_is_never_rewritten(tiny, tmp_path):
    model, _ = tiny
    uri = save_checkpoint(model, str(tmp_path), "planner", 1)
    before = (Path(uri) / "manifest.json").read_bytes()
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(_perturbed(model), str(tmp_path), "planner", 1)
    assert (Path(uri) / "manifest.json").read_bytes() == before
    assert not [p for p in (tmp_path / "planner").iterdir() if p.name.startswith(".tmp-")]
    # A version its owner never committed is discarded first (rename, then delete).
    assert discard_version(str(tmp_path), "planner", 1)
    assert list_versions(str(tmp_path), "planner") == []
    save_checkpoint(model, str(tmp_path), "planner", 1)
    state, _ = load_checkpoint(str(tmp_path), "planner", 1)
    assert torch.equal(state["model.norm.weight"], model.state_dict()["model.norm.weight"])


def test_clean_leftovers_removes_what_killed_writers_left(tiny, tmp_path):
    model, _ = tiny
    root = str(tmp_path)
    save_checkpoint(model, root, "planner", 1)
    base = tmp_path / "planner"
    (base / ".tmp-v000002-deadbeef").mkdir()
    (base / ".tmp-v000002-deadbeef" / "model.safetensors").write_bytes(b"torn")
    (base / ".trash-v000003-cafe0000").mkdir()
    (base / "v000002.optimizer.pt.tmp-0badf00d").write_bytes(b"torn")
    (base / "v000001.optimizer.pt").write_bytes(b"kept")
    assert clean_leftovers(root, "planner") == [
        ".tmp-v000002-deadbeef", ".trash-v000003-cafe0000", "v000002.optimizer.pt.tmp-0badf00d"]
    assert sorted(p.name for p in base.iterdir()) == ["v000001", "v000001.optimizer.pt"]
    assert load_checkpoint(root, "planner")[1]["version"] == 1


def test_no_checkpoint_gives_a_clear_error(tmp_path):
    assert latest_version(str(tmp_path), "planner") is None
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_checkpoint(str(tmp_path), "planner")


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import mgrpo.models.checkpoint as ck
    from mgrpo.models import load_model
    model, _ = load_model(sys.argv[1])
    real_open = ck.fsspec.core.url_to_fs

    class SlowFS:
        # wraps the real filesystem: after the first data file is written, announce and hang
        def __init__(self, fs):
            self.fs = fs
        def __getattr__(self, name):
            return getattr(self.fs, name)
        def open(self, path, mode="rb"):
            handle = self.fs.open(path, mode)
            if "w" in mode and ".tmp-" in path:
                class Hang:
                    def __enter__(s):
                        return handle.__enter__()
                    def __exit__(s, *exc):
                        handle.__exit__(*exc)
                        print("WRITING", flush=True)
                        time.sleep(60)
                return Hang()
            return handle

    def slow_url_to_fs(uri, **kw):
        fs, path = real_open(uri, **kw)
        return SlowFS(fs), path

    ck.fsspec.core.url_to_fs = slow_url_to_fs
    ck.save_checkpoint(model, sys.argv[2], "planner", 2)
""")


def test_writer_killed_mid_save_leaves_previous_version_loadable(tiny, tiny_dir, tmp_path):
    model, _ = tiny
    root = str(tmp_path / "ck")
    save_checkpoint(model, root, "planner", 1)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tiny_dir), root],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "WRITING"  # v2 is half written now
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    fs, _ = fsspec.core.url_to_fs(root)
    leftovers = [p for p in fs.ls(f"{root}/planner", detail=False) if ".tmp-v000002" in p]
    assert leftovers, "the killed writer should have left a partial temp folder"
    assert list_versions(root, "planner") == [1]
    assert latest_version(root, "planner") == 1
    state, manifest = load_checkpoint(root, "planner")
    assert manifest["version"] == 1
    with pytest.raises(CheckpointError, match="not completely written"):
        read_checkpoint_dir(leftovers[0])


_REWRITER = textwrap.dedent("""
    # The trainer's write sequence (optimizer state, then weights) aimed at an EXISTING
    # version, as a second run or a retried round used to do; hangs at the first write.
    import sys, time, torch
    import mgrpo.models.checkpoint as ck
    import mgrpo.parallel.optimizer_state as opt
    from mgrpo.models import load_model
    model, _ = load_model(sys.argv[1])
    for p in model.parameters():
        p.data.add_(0.5)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    adam.step()
    if sys.argv[3] == "hang":
        real_url_to_fs = opt.fsspec.core.url_to_fs
        class Hang:
            def __init__(self, fs): self.fs = fs
            def __getattr__(self, name): return getattr(self.fs, name)
            def mv(self, *a, **k):
                print("WRITING", flush=True)
                time.sleep(60)
        def hanging(uri, **kw):
            fs, path = real_url_to_fs(uri, **kw)
            return Hang(fs), path
        opt.fsspec.core.url_to_fs = hanging
        ck.fsspec.core.url_to_fs = hanging
    root = sys.argv[2]
    try:
        extra = {"optimizer": opt.save_optimizer_state(adam, ck.version_uri(root, "planner", 1))}
        ck.save_checkpoint(model, root, "planner", 1, extra=extra)
    except (ck.CheckpointError, opt.OptimizerStateError) as error:
        print("REFUSED", error, flush=True)
        sys.exit(0)
    print("REWROTE", flush=True)
""")


@pytest.mark.parametrize("mode", ["complete", "hang"])
def test_rewriting_a_recorded_version_is_refused_even_when_killed(tiny, tiny_dir, tmp_path,
                                                                 mode):
    """Issue 16 item 4: a second writer of a recorded version (the rewrite path) left it
    unloadable or its optimizer state failing verification. Now nothing of v1 changes: the
    rewrite is refused before any byte is written; ``hang`` kills the writer if it gets to
    a rename (the old code did)."""
    from mgrpo.parallel.optimizer_state import load_optimizer_state, save_optimizer_state

    model, _ = tiny
    root = str(tmp_path / "ck")
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    adam.step()
    extra = {"optimizer": save_optimizer_state(adam, f"{root}/planner/v000001")}
    uri = save_checkpoint(model, root, "planner", 1, extra=extra)
    files = {p.name: p.read_bytes() for p in Path(uri).iterdir()}
    moments = Path(f"{uri}.optimizer.pt").read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", _REWRITER, str(tiny_dir), root, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if line == "WRITING":
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert line.startswith("REFUSED"), (line, proc.stderr.read()[-2000:])
    assert {p.name: p.read_bytes() for p in Path(uri).iterdir()} == files
    assert Path(f"{uri}.optimizer.pt").read_bytes() == moments
    state, _ = load_checkpoint(root, "planner", 1)
    assert torch.equal(state["model.norm.weight"], model.state_dict()["model.norm.weight"])
    fresh = torch.optim.Adam(model.parameters(), lr=0.1)
    assert load_optimizer_state(fresh, uri)


def test_lora_checkpoint_stores_only_adapter_weights(tiny, tiny_dir, tmp_path):
    from mgrpo.models.lora import LoraSpec, apply_lora

    model, _ = tiny
    peft_model = apply_lora(model, LoraSpec(r=4))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)  # lora_B starts at zero; make the adapter do something
    save_checkpoint(peft_model, str(tmp_path), "searcher", 5)
    state, manifest = load_checkpoint(str(tmp_path), "searcher")
    assert manifest["kind"] == "lora"
    assert state and all("lora_" in key for key in state)
    other = apply_lora(load_model(tiny_dir)[0], LoraSpec(r=4))
    load_checkpoint(str(tmp_path), "searcher", model=other)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(other(ids).logits, peft_model(ids).logits, atol=1e-6)
    with pytest.raises(ValueError, match="apply_lora"):
        load_checkpoint(str(tmp_path), "searcher", model=load_model(tiny_dir)[0])
