"""LoRA on one agent (issue 12 item 4): the run config's ``models.<m>.lora``, an embedded
round that trains and checkpoints only the adapter, resume, the KL reference = the base with
the adapter disabled, and a full-weights load into a LoRA engine. Real tiny Qwen2 + peft."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError
from test_training_kl_rollout import _sampled
from training_testkit import run_config_dict

from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.models import load_model
from mgrpo.models.lora import LoraSpec, apply_lora, trainable_parameters
from mgrpo.training.config import LossConfig, ModelConfig, RunConfig
from mgrpo.training.loop import run_training
from mgrpo.training.reference import reference_for
from mgrpo.training.update import UpdateSpec, policy_update

SPEC = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _lora_cfg(tmp_path, tiny_dir, bench_dir, **overrides) -> RunConfig:
    data = run_config_dict(tmp_path, tiny_dir, bench_dir, **overrides)
    data["models"]["planner"]["lora"] = SPEC
    return RunConfig.model_validate(data)


def _base(state: dict) -> dict:
    """A peft model's base weights under their plain names."""
    return {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v
            for k, v in state.items() if ".lora_" not in k}


def test_lora_block_is_validated(tmp_path, tiny_dir, bench_dir):
    cfg = _lora_cfg(tmp_path, tiny_dir, bench_dir)
    assert cfg.models["planner"].lora == LoraSpec(**SPEC)
    assert cfg.models["searcher"].lora is None
    data = run_config_dict(tmp_path, tiny_dir, bench_dir)
    data["models"]["planner"]["lora"] = {"rank": 4}
    with pytest.raises(ValidationError, match="unknown key 'rank'"):
        RunConfig.model_validate(data)
    data["models"]["planner"].update(lora=SPEC, trainable=False)
    with pytest.raises(ValidationError, match="trainable: false"):
        RunConfig.model_validate(data)
    data["models"]["planner"].update(trainable=True, ref_path=str(tiny_dir))
    with pytest.raises(ValidationError, match="drop ref_path"):
        RunConfig.model_validate(data)
    data["models"]["planner"].pop("ref_path")
    data["engines"] = {"planner": "http://vllm:8000"}
    with pytest.raises(ValidationError, match="server URL but model 'planner' trains a LoRA"):
        RunConfig.model_validate(data)


def test_embedded_rounds_train_only_the_adapter_and_resume(tmp_path, tiny_dir, bench_dir):
    from mgrpo.models.checkpoint import load_checkpoint, read_checkpoint_dir, version_uri
    from mgrpo.parallel.optimizer_state import optimizer_state_uri
    from mgrpo.training.loop import checkpoint_root

    cfg = _lora_cfg(tmp_path, tiny_dir, bench_dir, loss={"kl_coef": 0.1})
    first = run_training(cfg, progress=False, stop_after=1)
    assert first.rounds == 1
    resumed = run_training(cfg, resume=True, progress=False)
    assert resumed.rounds == 2
    root = checkpoint_root(cfg)
    state, manifest = read_checkpoint_dir(version_uri(root, "planner", 2))
    assert manifest["kind"] == "lora"
    assert set(manifest["files"]) >= {"adapter_model.safetensors", "adapter_config.json"}
    assert state and all("lora_A" in k or "lora_B" in k for k in state)
    # 2 layers x (q, v) x (A, B) = 8 tensors, the only ones in the optimizer state too
    assert len(state) == 8
    assert len(torch.load(optimizer_state_uri(version_uri(root, "planner", 2)))["state"]) == 8
    lora_bytes = manifest["files"]["adapter_model.safetensors"]["size"]
    _, full = read_checkpoint_dir(version_uri(root, "searcher", 2))
    assert full["kind"] == "full"
    assert lora_bytes * 20 < full["files"]["model.safetensors"]["size"]
    # the base weights a LoRA model samples with are the starting folder's, bit for bit
    model, _ = load_model(tiny_dir)
    peft = apply_lora(load_model(tiny_dir)[0], LoraSpec(**SPEC))
    load_checkpoint(root, "planner", version=2, model=peft)
    start = model.state_dict()
    for key, value in _base(peft.state_dict()).items():
        assert torch.equal(value, start[key]), key
    from mgrpo.store import Store

    store = Store(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    for r in store.list_rounds("t"):
        assert r.status == "done"
        # the reference is the base (adapter off); B = 0 at the start (and without a reward
        # signal on a random tiny model the adapter stays there): KL 0
        assert store.metrics("t", r.round_id)[r.round_id]["planner/kl"] == \
            pytest.approx(0.0, abs=1e-7)
    assert json.loads((tmp_path / "run" / "state.json").read_text())["completed_rounds"] == 2


def test_update_moves_only_the_adapter_and_the_reference_is_the_base(tiny_dir):
    model, tok = load_model(tiny_dir)
    samples = _sampled(model, tok, 1.0)  # advantages +-1: a real gradient
    start = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    peft = apply_lora(model, LoraSpec(**SPEC))
    adapter0 = {k: v.clone() for k, v in peft.state_dict().items() if ".lora_" in k}
    params = trainable_parameters(peft)
    assert len(params) == 8 and sum(p.numel() for p in params) < 0.1 * sum(
        p.numel() for p in peft.parameters())
    mcfg = ModelConfig(path=str(tiny_dir), mini_batches=3, micro_batch_size=2, lora=SPEC)
    lcfg = LossConfig(kl_coef=0.1)

    class Lm:
        name, model, ref_model = "planner", peft, None

    ref = reference_for(Lm, mcfg, lcfg)
    metrics = policy_update(peft, torch.optim.Adam(params, lr=1e-2), samples,
                            UpdateSpec(mcfg, lcfg, tok.pad_token_id), ref_model=ref,
                            generator=torch.Generator().manual_seed(0))
    assert metrics["grad_norm"] > 0 and metrics["kl"] > 1e-6  # steps 2, 3 moved off the base
    after = peft.state_dict()
    moved = [k for k in adapter0 if not torch.equal(after[k], adapter0[k])]
    assert any("lora_B" in k for k in moved)
    for key, value in _base(after).items():
        assert torch.equal(value, start[key]), key
    # the reference computes exactly the starting model
    ids = torch.tensor([samples[0].trajectory.input_ids])
    with torch.no_grad():
        base_model, _ = load_model(tiny_dir)
        want = base_model(input_ids=ids).logits
        assert torch.allclose(ref(input_ids=ids).logits, want, atol=1e-6)
        assert not torch.allclose(peft(input_ids=ids).logits, want, atol=1e-4)


def test_full_weights_into_a_lora_engine_reset_the_adapter(tiny_dir, tmp_path):
    from mgrpo.models.checkpoint import save_checkpoint
    from mgrpo.models.loading import folder_weights

    peft = apply_lora(load_model(tiny_dir)[0], LoraSpec(**SPEC))
    tok = load_model(tiny_dir)[1]
    engine = TorchEngine(peft, tok)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.fill_(0.5)
    uri = save_checkpoint(peft, str(tmp_path), "planner", 3)
    ids = torch.tensor([[5, 17, 33, 40]])
    with torch.no_grad():
        trained = peft(input_ids=ids).logits.clone()
        engine.load_weights(folder_weights(str(tiny_dir)), 0)  # a run's starting folder
        assert all(not p.any() for n, p in peft.named_parameters() if "lora_B" in n)
        base = load_model(tiny_dir)[0](input_ids=ids).logits
        assert torch.allclose(peft(input_ids=ids).logits, base, atol=1e-6)
        engine.load_weights(uri, 3)  # the adapter checkpoint puts the trained adapter back
        assert engine.version == 3
        assert torch.allclose(peft(input_ids=ids).logits, trained, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit the LoRA model's base"):
        engine.load_weights({"nope.weight": torch.zeros(1)}, 4)


def test_a_separate_sampler_gets_each_adapter_checkpoint(tmp_path, tiny_dir, bench_dir):
    """An engine in the model's record that is not over the trained model (the vLLM tier puts
    a VLLMEngine there) is given each round's checkpoint: here a TorchEngine over a second
    LoRA copy, whose adapter must become the trainer's."""
    from dataclasses import replace

    from mgrpo.store import Store
    from mgrpo.training.loop import run_round
    from mgrpo.training.system import build_system

    cfg = _lora_cfg(tmp_path, tiny_dir, bench_dir)
    system = build_system(cfg)
    planner = system.models["planner"]
    with torch.no_grad():  # move the trainer's adapter off the identity
        for name, p in planner.model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    copy = apply_lora(load_model(tiny_dir)[0], LoraSpec(**SPEC))
    sampler = TorchEngine(copy, planner.tokenizer)
    system.models["planner"] = planner = replace(planner, engine=sampler)
    system.runtimes["planner"] = replace(system.runtimes["planner"], engine=sampler)
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    store.create_run("t", "t", cfg.model_dump(mode="json"))
    run_round(system, store, "t", 0, system.bench.questions("train", stage=1))
    assert sampler.version == 1
    trained = {k: v for k, v in planner.model.state_dict().items() if ".lora_" in k}
    pushed = copy.state_dict()
    assert trained and all(torch.equal(pushed[k], v) for k, v in trained.items())
    assert any(v.abs().max() > 0 for k, v in trained.items() if "lora_B" in k)
    store.close()


def test_is_lora_model_never_imports_peft(tiny_dir):
    """A plain model is told apart without importing peft (~0.6 s, once per process: it was on
    a distributed round's critical path, each trainer's first weight load); a peft model,
    built after, is still recognised."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from mgrpo.models import load_model\n"
        "from mgrpo.models.lora import apply_lora, is_lora_model\n"
        f"model, _ = load_model({str(tiny_dir)!r}, device='cpu')\n"
        "assert 'peft' not in sys.modules, 'peft imported before the check'\n"
        "assert is_lora_model(model) is False\n"
        "assert 'peft' not in sys.modules, 'is_lora_model imported peft'\n"
        "assert is_lora_model(apply_lora(model)) is True\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_an_adapter_checkpoint_loads_its_base_from_any_working_folder(tmp_path, tiny_dir,
                                                                       monkeypatch):
    """The base loaded by a path relative to the working folder (as a run config's
    ``models.<m>.path: runs/tiny`` is) is recorded absolute: peft loads the adapter with its
    base from another working folder."""
    import shutil

    from peft import AutoPeftModelForCausalLM

    from mgrpo.models.checkpoint import save_checkpoint, version_uri

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    shutil.copytree(tiny_dir, work / "base")
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    model = apply_lora(load_model("base")[0], LoraSpec(**SPEC))
    save_checkpoint(model, str(tmp_path / "ckpt"), "planner", 1)
    folder = version_uri(str(tmp_path / "ckpt"), "planner", 1)
    monkeypatch.chdir(elsewhere)
    recorded = json.loads((tmp_path / "ckpt" / "planner" / "v000001" /
                           "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(work / "base")
    loaded = AutoPeftModelForCausalLM.from_pretrained(folder)
    assert sum(p.numel() for n, p in loaded.named_parameters() if "lora_" in n) > 0
