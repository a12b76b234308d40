"""Agents as adapters on one base (``models.<m>.share_base``): LoRA models on one base folder
hold one copy of its frozen weights after ``load_models``, train their own adapters through a
real embedded round exactly as untied models do, and mismatched bases are refused. Real tiny
Qwen2 + peft."""

from __future__ import annotations

import logging

import pytest
import torch
from training_testkit import run_config_dict, sampled_samples

from mgrpo.engines.base import SamplingParams
from mgrpo.models import TinyModelConfig, init_tiny, load_model
from mgrpo.models.lora import LoraSpec, apply_lora, load_base_state
from mgrpo.models.shared_base import (
    base_name,
    share_frozen_base,
    shares_base,
    unique_storage_bytes,
)
from mgrpo.training.config import RunConfig
from mgrpo.training.reference import reference_for
from mgrpo.training.system import load_models
from mgrpo.training.update import UpdateSpec, policy_update

SPEC = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
WIDE = {"r": 2, "alpha": 4, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
TIMES = ("time/", "throughput/")


def _cfg(tmp_path, tiny_dir, bench_dir, lora: dict, share: bool = True, **overrides):
    data = run_config_dict(tmp_path, tiny_dir, bench_dir, **overrides)
    for name, spec in lora.items():
        data["models"][name].update(lora=spec, share_base=share)
    return RunConfig.model_validate(data)


def _frozen(model) -> dict[str, torch.Tensor]:
    return {base_name(n): p for n, p in model.named_parameters() if not p.requires_grad}


def _adapter(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def test_three_lora_agents_hold_one_base(tmp_path, tiny_dir, bench_dir, caplog):
    lora = {"planner": SPEC, "searcher": SPEC, "coder": WIDE}  # another rank and targets too
    with caplog.at_level(logging.INFO, logger="mgrpo.training.system"):
        models = load_models(_cfg(tmp_path, tiny_dir, bench_dir, lora))
    nets = [models[m].model for m in ("planner", "searcher", "coder")]
    first = _frozen(nets[0])
    assert len(first) > 10
    for net in nets[1:]:
        frozen = _frozen(net)
        assert frozen.keys() == first.keys()
        assert all(frozen[k] is first[k] and frozen[k].data_ptr() == first[k].data_ptr()
                   for k in first)
    ptrs = [{p.data_ptr() for p in _adapter(net).values()} for net in nets]
    assert all(ptrs) and not (ptrs[0] & ptrs[1]) and not (ptrs[0] & ptrs[2])
    assert all(shares_base(net) for net in nets)
    untied = load_models(_cfg(tmp_path, tiny_dir, bench_dir, lora, share=False))
    nets_untied = [untied[m].model for m in ("planner", "searcher", "coder")]
    assert not any(shares_base(net) for net in nets_untied)
    count, held = unique_storage_bytes(nets)
    count_untied, held_untied = unique_storage_bytes(nets_untied)
    base_bytes = sum(p.untyped_storage().nbytes() for p in
                     {p.data_ptr(): p for p in first.values()}.values())
    assert count < count_untied and held_untied - held >= 2 * base_bytes
    (line,) = [r.getMessage() for r in caplog.records if "share one copy" in r.getMessage()]
    assert "planner, searcher, coder" in line and "MB saved" in line
    # the same values as untied models (the adapters' seeded init consumed in the same order)
    for tied, own in zip(nets, nets_untied, strict=True):
        assert all(torch.equal(v, own.state_dict()[k]) for k, v in tied.state_dict().items())


def test_full_weight_models_and_opt_outs_keep_their_own_base(tmp_path, tiny_dir, bench_dir):
    data = run_config_dict(tmp_path, tiny_dir, bench_dir)
    data["models"]["planner"]["lora"] = SPEC
    data["models"]["searcher"].update(lora=SPEC, share_base=False)  # coder: full weights
    models = load_models(RunConfig.model_validate(data))
    ptrs = {m: {p.data_ptr() for p in models[m].model.parameters()} for m in models}
    assert not (ptrs["planner"] & ptrs["searcher"]) and not (ptrs["planner"] & ptrs["coder"])
    assert not any(shares_base(lm.model) for lm in models.values())


def _round(tmp_path, tiny_dir, bench_dir, share: bool):
    """One real embedded round of planner and searcher as LoRA adapters (coder full weights),
    their adapters moved off the identity first so the KL term has a gradient, then one
    update of each adapter; the round's and the updates' metrics."""
    from mgrpo.store import Store
    from mgrpo.training.loop import run_round
    from mgrpo.training.system import build_system

    out = tmp_path / ("tied" if share else "untied")
    cfg = _cfg(out, tiny_dir, bench_dir, {"planner": SPEC, "searcher": SPEC}, share=share,
               loss={"kl_coef": 0.5})
    system = build_system(cfg)
    with torch.no_grad():
        for i, m in enumerate(("planner", "searcher")):
            for name, p in system.models[m].model.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.05 * (i + 1))
    before = {m: {k: v.detach().clone() for k, v in _adapter(system.models[m].model).items()}
              for m in ("planner", "searcher")}
    base = {k: v.detach().clone() for k, v in _frozen(system.models["planner"].model).items()}
    store = Store(f"sqlite:///{out / 'store.db'}")
    store.upgrade()
    store.create_run("t", "t", cfg.model_dump(mode="json"))
    metrics = run_round(system, store, "t", 0, system.bench.questions("train", stage=1))
    store.close()
    # a random planner may never call the searcher: a real update of each adapter on samples
    # with advantages +-1 (the KL reference: its shared base, adapter disabled)
    plain, tok = load_model(tiny_dir)
    samples = sampled_samples(plain, tok, [[5 + i, 17, 33, 40 + 3 * i] for i in range(4)],
                              lambda i: SamplingParams(max_new_tokens=5, seed=i),
                              lambda i: 1.0 if i % 2 else -1.0)
    for m in ("planner", "searcher"):
        lm = system.models[m]
        mcfg = cfg.models[m]
        metrics.update({f"step/{m}/{k}": v for k, v in policy_update(
            lm.model, lm.optimizer, samples, UpdateSpec(mcfg, cfg.loss, tok.pad_token_id),
            ref_model=reference_for(lm, mcfg, cfg.loss),
            generator=torch.Generator().manual_seed(0)).items()})
    return system, before, base, metrics


def test_a_round_trains_each_adapter_leaves_the_shared_base_and_equals_untied(
        tmp_path, tiny_dir, bench_dir):
    system, before, base, metrics = _round(tmp_path, tiny_dir, bench_dir, share=True)
    planner, searcher = (system.models[m].model for m in ("planner", "searcher"))
    assert shares_base(planner) and shares_base(searcher)
    for m, net in (("planner", planner), ("searcher", searcher)):
        moved = [k for k, v in _adapter(net).items() if not torch.equal(v, before[m][k])]
        assert any("lora_B" in k for k in moved), m
    for net in (planner, searcher):  # the shared base is still the starting folder's
        frozen = _frozen(net)
        assert all(torch.equal(frozen[k], v) for k, v in base.items())
    a, b = _adapter(planner), _adapter(searcher)
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert metrics["step/planner/grad_norm"] > 0 and metrics["step/searcher/grad_norm"] > 0
    assert metrics["step/searcher/kl"] > 0  # the adapter differs from the shared base

    untied, _, _, untied_metrics = _round(tmp_path, tiny_dir, bench_dir, share=False)
    assert not shares_base(untied.models["planner"].model)
    for m in ("planner", "searcher", "coder"):  # bit for bit: the same computation
        own = untied.models[m].model.state_dict()
        assert all(torch.equal(v, own[k])
                   for k, v in system.models[m].model.state_dict().items()), m
    same = {k: v for k, v in metrics.items() if not k.startswith(TIMES)}
    assert same == {k: v for k, v in untied_metrics.items() if not k.startswith(TIMES)}


def test_mismatched_bases_are_refused(tmp_path, tiny_dir):
    other = init_tiny(tmp_path / "wide", TinyModelConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400))
    spec = LoraSpec(**SPEC)
    a, b = (apply_lora(load_model(d)[0], spec) for d in (tiny_dir, other))
    with pytest.raises(ValueError, match=r"cannot share the base of model 0: .*\(400, 32\)"):
        share_frozen_base([a, b])
    c = apply_lora(load_model(tiny_dir)[0].to(torch.bfloat16), spec)
    with pytest.raises(ValueError, match="bfloat16"):
        share_frozen_base([a, c])
    d = apply_lora(load_model(tiny_dir)[0], spec)
    with torch.no_grad():
        d.get_base_model().model.norm.weight.add_(1.0)  # same shapes, other values
    with pytest.raises(ValueError, match="values differ"):
        share_frozen_base([a, d])
    with pytest.raises(ValueError, match="not a peft"):
        share_frozen_base([a, load_model(tiny_dir)[0]])
    assert not any(shares_base(m) for m in (a, b, c, d))  # nothing was changed


def test_a_full_weights_load_into_a_shared_base_must_equal_it(tiny_dir):
    from mgrpo.models.loading import folder_weights

    spec = LoraSpec(**SPEC)
    a, b = (apply_lora(load_model(tiny_dir)[0], spec) for _ in range(2))
    share_frozen_base([a, b])
    with torch.no_grad():
        for name, p in a.named_parameters():
            if "lora_B" in name:
                p.fill_(0.5)
    state = folder_weights(str(tiny_dir))
    load_base_state(a, state)  # the starting folder: equal, accepted, the adapter reset
    assert all(not p.any() for n, p in a.named_parameters() if "lora_B" in n)
    changed = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in state.items()}
    base = {k: v.clone() for k, v in _frozen(b).items()}
    with pytest.raises(ValueError, match="share_base: false"):
        load_base_state(a, changed)
    assert all(torch.equal(_frozen(b)[k], v) for k, v in base.items())  # b's base untouched
