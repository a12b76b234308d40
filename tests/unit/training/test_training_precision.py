"""Training a real model's way (per model config): bf16 autocast, gradient checkpointing,
learning-rate schedules with warm-up, weight decay, PPO epochs, an entropy bonus and a token
budget per micro-batch. Real tiny Qwen2, real updates, CPU."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from test_training_fused_old import _samples
from training_testkit import run_config_dict

from mgrpo.algo.schedules import lr_at
from mgrpo.models import load_model
from mgrpo.training.config import LossConfig, ModelConfig, RunConfig
from mgrpo.training.precision import make_optimizer, prepare_for_training
from mgrpo.training.update import UpdateSpec, micro_batches, policy_update


@pytest.fixture(scope="module")
def samples(tiny_dir):
    model, tok = load_model(tiny_dir)
    return _samples(model, tok)


def _update(tiny_dir, samples, model=None, optimizer=None, loss=None, total_steps=None,
            generator=None, recompute_old=True, **model_kw):
    if model is None:
        model, _ = load_model(tiny_dir)
    mcfg = ModelConfig(path=str(tiny_dir), **{"micro_batch_size": 3, "lr": 3e-2, **model_kw})
    prepare_for_training(model, mcfg)
    optimizer = optimizer or make_optimizer(model, mcfg)
    spec = UpdateSpec(mcfg, LossConfig(**(loss or {})), pad_id=0, temperature=0.8,
                      total_steps=total_steps, recompute_old=recompute_old)
    metrics = policy_update(model, optimizer, samples, spec,
                            generator=generator or torch.Generator().manual_seed(0))
    return metrics, model, optimizer


def test_bf16_autocast_trains_near_float32(tiny_dir, samples):
    """Three steps at lr 1e-3 in bf16 autocast (float32 master weights and Adam state)
    against float32: the mean step loss within 0.005 of float32's (measured: 0.0005), the
    entropy within 0.1 %, the weights stay float32 and move."""
    f32, _, _ = _update(tiny_dir, samples, mini_batches=3, lr=1e-3)
    b16, m16, opt = _update(tiny_dir, samples, mini_batches=3, dtype="bfloat16", lr=1e-3)
    assert b16["loss"] == pytest.approx(f32["loss"], abs=0.005)
    assert b16["pg_loss"] == pytest.approx(f32["pg_loss"], abs=0.005)
    assert b16["entropy"] == pytest.approx(f32["entropy"], rel=1e-3)
    assert all(p.dtype == torch.float32 for p in m16.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    start, _ = load_model(tiny_dir)
    moved = [not torch.equal(a, b) for a, b in zip(m16.parameters(), start.parameters(),
                                                   strict=True)]
    assert all(moved)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir, samples):
    grads = []
    for checkpointing in (False, True):
        _, model, _ = _update(tiny_dir, samples, gradient_checkpointing=checkpointing,
                              lr=1e-12)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    plain, ckpt = grads
    assert plain.keys() == ckpt.keys()
    for name in plain:
        assert torch.allclose(plain[name], ckpt[name], atol=1e-6, rtol=0), name


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_schedules_match_hugging_face(schedule):
    from transformers import get_scheduler

    base, warmup, total = 0.1, 3, 12
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=base)
    name = "constant_with_warmup" if schedule == "constant" else schedule
    hf = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total)
    for step in range(total):
        assert lr_at(step, base, schedule, warmup, total) == pytest.approx(
            opt.param_groups[0]["lr"], abs=1e-12), step
        opt.step()
        hf.step()
    assert lr_at(5, base, "cosine", 0, 10) == pytest.approx(0.05)  # half-way: half the rate


def test_policy_update_sets_each_steps_rate_from_the_optimizer_step_count(tiny_dir, samples):
    """Two updates of 2 steps each continue one cosine schedule: the 4th step runs at
    lr_at(3); a fresh optimizer would restart it."""
    kw = {"mini_batches": 2, "lr_schedule": "cosine", "warmup_steps": 1}
    _, model, opt = _update(tiny_dir, samples, total_steps=6, **kw)
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(1, 3e-2, "cosine", 1, 6))
    _update(tiny_dir, samples, model=model, optimizer=opt, total_steps=6, **kw)
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(3, 3e-2, "cosine", 1, 6))


def test_two_epochs_equal_two_calls_of_one_epoch(tiny_dir, samples):
    """Same pi_old (the rollout's), same shuffles (one generator), same Adam: one call with
    ppo_epochs=2 is two calls with ppo_epochs=1."""
    gen = torch.Generator().manual_seed(3)
    _, once, _ = _update(tiny_dir, samples, ppo_epochs=2, mini_batches=2, generator=gen,
                         recompute_old=False)
    gen = torch.Generator().manual_seed(3)
    _, twice, opt = _update(tiny_dir, samples, mini_batches=2, generator=gen,
                            recompute_old=False)
    _update(tiny_dir, samples, model=twice, optimizer=opt, mini_batches=2, generator=gen,
            recompute_old=False)
    for (name, a), b in zip(once.named_parameters(), twice.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_token_budget_micro_batches_bound_the_forward_and_keep_the_update(tiny_dir, samples):
    lengths = torch.tensor([5, 9, 3, 3, 12, 2])
    assert micro_batches(lengths, 4, 20) == [slice(0, 2), slice(2, 4), slice(4, 5),
                                             slice(5, 6)]
    assert micro_batches(lengths, 2, None) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    model, _ = load_model(tiny_dir)
    shapes = []
    model.register_forward_hook(lambda mod, args, kwargs, out: shapes.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    budget, _, _ = _update(tiny_dir, samples, model=model, micro_batch_size=8,
                           micro_batch_tokens=24, mini_batches=2)
    assert shapes and all(rows * width <= 24 or rows == 1 for rows, width in shapes[-8:])
    by_count, _, _ = _update(tiny_dir, samples, micro_batch_size=8, mini_batches=2)
    for key in ("loss", "pg_loss", "entropy", "ratio_max", "grad_norm", "num_tokens"):
        assert budget[key] == pytest.approx(by_count[key], abs=1e-5), key


def test_entropy_bonus_and_weight_decay(tiny_dir, samples):
    plain, _, _ = _update(tiny_dir, samples)
    bonus, _, _ = _update(tiny_dir, samples, loss={"entropy_coef": 0.01})
    assert bonus["loss"] == pytest.approx(plain["loss"] - 0.01 * plain["entropy"], abs=1e-5)
    _, _, opt = _update(tiny_dir, samples, weight_decay=0.1)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["weight_decay"] == 0.1


@pytest.mark.parametrize(("model_kw", "message"), [
    ({"dtype": "float16"}, "'float32' or 'bfloat16'"),
    ({"lr_schedule": "cosine", "warmup_steps": 10, "lr_total_steps": 10}, "never end"),
    ({"lr_total_steps": 10}, "lr_schedule constant does nothing"),
    ({"lr_schedule": "step"}, "'constant', 'linear' or 'cosine'"),
    ({"ppo_epochs": 0}, "greater than or equal to 1"),
    ({"micro_batch_tokens": 0}, "greater than or equal to 1"),
])
def test_bad_training_settings_are_refused(model_kw, message):
    with pytest.raises(ValidationError, match=message):
        ModelConfig(path="m", **model_kw)


def test_a_warmup_longer_than_the_run_is_refused(tmp_path, tiny_dir, bench_dir):
    data = run_config_dict(tmp_path, tiny_dir, bench_dir)  # 2 rounds x 1 step
    data["models"]["planner"].update(lr_schedule="linear", warmup_steps=2)
    with pytest.raises(ValidationError, match="warmup_steps=2 >= the run's 2 optimizer"):
        RunConfig.model_validate(data)


def test_bf16_checkpointed_cosine_run_trains_embedded(tmp_path, tiny_dir, bench_dir):
    from mgrpo.training.loop import run_training

    data = run_config_dict(tmp_path, tiny_dir, bench_dir, loss={"kl_coef": 0.05})
    for m in data["models"].values():
        m.update(dtype="bfloat16", gradient_checkpointing=True, lr_schedule="cosine",
                 warmup_steps=1, mini_batches=2, ppo_epochs=2, weight_decay=0.01,
                 micro_batch_tokens=256)
    cfg = RunConfig.model_validate(data)
    assert cfg.optimizer_steps("planner") == 8
    assert run_training(cfg, progress=False).rounds == 2


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_the_fused_adam_step_equals_the_default_one(weight_decay):
    from mgrpo.training.precision import fresh_optimizer

    torch.manual_seed(0)
    start = [torch.randn(30, 7), torch.randn(7)]
    grads = [[torch.randn_like(w) * 10.0 ** -k for k, w in enumerate(start)] for _ in range(5)]
    weights = []
    for fused in (True, False):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        model = torch.nn.ParameterList(params)
        optimizer = make_optimizer(model, ModelConfig(path="-", lr=1e-2,
                                                      weight_decay=weight_decay))
        assert optimizer.defaults["fused"] is True
        if not fused:
            optimizer = type(optimizer)(params, lr=1e-2, weight_decay=weight_decay)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            optimizer.step()
        weights.append([p.detach().clone() for p in params])
    for a, b in zip(*weights, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert fresh_optimizer(optimizer, model, 0.1).defaults["fused"] in (None, False)
    fused_again = make_optimizer(model, ModelConfig(path="-"))
    assert fresh_optimizer(fused_again, model, 0.1).defaults["fused"] is True


def test_master_weights_adam_steps_float32_copies_of_bf16_parameters():
    from mgrpo.training.precision import MasterWeightsAdam, optimizer_step_count

    torch.manual_seed(0)
    start = torch.randn(40, 9)
    grads = [torch.randn(40, 9) for _ in range(3)]
    bf16 = torch.nn.Parameter(start.to(torch.bfloat16))
    reference = torch.nn.Parameter(start.to(torch.bfloat16).float())
    master, plain = MasterWeightsAdam([bf16], lr=1e-4), torch.optim.Adam([reference], lr=1e-4)
    for g in grads:
        bf16.grad, reference.grad = g.to(torch.bfloat16), g.to(torch.bfloat16).float()
        master.step()
        plain.step()
        master.zero_grad()
    assert bf16.dtype == torch.bfloat16 and bf16.grad is None
    torch.testing.assert_close(master.master[0], reference.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(bf16.float(), reference.detach().to(torch.bfloat16).float())
    # updates of 1e-4 move the float32 master copy though bf16 alone would round most away
    assert (master.master[0] != start.to(torch.bfloat16).float()).float().mean() > 0.9
    assert optimizer_step_count(master) == 3
