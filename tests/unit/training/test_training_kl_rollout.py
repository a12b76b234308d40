"""KL to a frozen reference, the entropy metric and the sampler/trainer agreement in the
embedded loop (issue 10 items 1, 5, 6): real tiny models, real updates."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from training_testkit import run_config_dict, sampled_samples

from mgrpo.engines.base import SamplingParams
from mgrpo.models import load_model
from mgrpo.training.config import LossConfig, ModelConfig, RunConfig
from mgrpo.training.loop import run_training
from mgrpo.training.reference import load_reference
from mgrpo.training.scoring import Sample
from mgrpo.training.update import UpdateSpec, policy_update


def _round_metrics(tmp_path, name: str = "t") -> list[dict[str, float]]:
    from mgrpo.store import Store

    store = Store(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    rounds = store.list_rounds(name)
    assert all(r.status == "done" for r in rounds)
    return [store.metrics(name, r.round_id)[r.round_id] for r in rounds]


def test_kl_to_the_starting_weights_entropy_and_rollout_agreement(tmp_path, tiny_dir,
                                                                   bench_dir):
    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, loss={"kl_coef": 0.1, "rollout_is": "token"},
        sampling={"planner_max_turns": 2, "subagent_max_turns": 2, "max_new_tokens": 6,
                  "temperature": 0.7}))
    result = run_training(cfg, progress=False)
    assert result.rounds == 2
    first, second = _round_metrics(tmp_path)
    for metrics in (first, second):
        # the reference = the starting weights; a random tiny model gets no reward signal,
        # so its weights stay put and the KL stays 0 (test_policy_update_kl_... moves them)
        assert metrics["planner/kl"] == pytest.approx(0.0, abs=1e-7)
        assert 0 < metrics["planner/entropy"] < 6.0  # log(400) = 5.99 at most
        # sampled at T = 0.7 and trained at T = 0.7 by the same weights: they agree
        assert metrics["planner/rollout_logp_diff_max"] < 1e-3
        assert 0 <= metrics["planner/rollout_logp_diff_mean"] <= 1e-3
        assert metrics["planner/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)


def test_kl_reference_from_a_named_folder(tmp_path, tiny_dir, bench_dir):
    from mgrpo.models import TinyModelConfig, init_tiny

    other = init_tiny(tmp_path / "ref", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400, seed=7))
    data = run_config_dict(tmp_path, tiny_dir, bench_dir, loss={"kl_coef": 0.1},
                           stages=[{"stage": 1, "rounds": 1}])
    data["models"]["planner"]["ref_path"] = str(other)
    run_training(RunConfig.model_validate(data), progress=False)
    (first,) = _round_metrics(tmp_path)
    assert first["planner/kl"] > 0.01  # another model's weights: far from round 0's policy


@pytest.mark.parametrize(("sampling", "message"), [
    ({"top_p": 0.9}, "top_p=0.9, top_k=0: training samples must come from the full softmax"),
    ({"top_k": 20}, "top_k=20"),
    ({"temperature": 0.0}, "greater than 0"),
])
def test_sampling_that_cannot_be_trained_is_refused(tmp_path, tiny_dir, bench_dir, sampling,
                                                    message):
    with pytest.raises(ValidationError, match=message):
        RunConfig.model_validate(run_config_dict(tmp_path, tiny_dir, bench_dir,
                                                 sampling=sampling))


def _sampled(model, tok, temperature: float, shift: float = 0.0) -> list[Sample]:
    """Six samples drawn by the torch engine at ``temperature``; advantages +-1; the
    recorded rollout logprobs moved by ``shift`` (a sampler that disagrees)."""
    prompts = [[5 + i, 17, 33, 40 + 3 * i] for i in range(6)]
    return sampled_samples(model, tok, prompts, lambda i: SamplingParams(
        temperature=temperature, max_new_tokens=6, seed=i), lambda i: 1.0 if i % 3 else -1.0,
        shift)


def _update(tiny_dir, samples, temperature=1.0, mini_batches=1, **loss):
    import torch

    model, tok = load_model(tiny_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    mcfg = ModelConfig(path=str(tiny_dir), mini_batches=mini_batches, micro_batch_size=2)
    lcfg = LossConfig(**loss)
    ref = load_reference(str(tiny_dir)) if lcfg.kl_coef > 0 else None
    return policy_update(model, optimizer, samples,
                         UpdateSpec(mcfg, lcfg, tok.pad_token_id, temperature=temperature),
                         ref_model=ref, generator=torch.Generator().manual_seed(0))


def test_policy_update_kl_is_zero_at_the_reference_and_grows_as_weights_move(tiny_dir):
    model, tok = load_model(tiny_dir)
    samples = _sampled(model, tok, 1.0)
    one = _update(tiny_dir, samples, kl_coef=0.1)  # one step, taken at the reference
    assert one["kl"] == pytest.approx(0.0, abs=1e-7) and one["grad_norm"] > 0
    three = _update(tiny_dir, samples, mini_batches=3, kl_coef=0.1)  # steps 2, 3 have moved
    assert three["kl"] > 1e-5
    assert three["loss"] > three["pg_loss"]  # the KL term (>= 0) is in the loss


def test_trainer_trains_the_temperature_it_sampled_at(tiny_dir):
    model, tok = load_model(tiny_dir)
    samples = _sampled(model, tok, 0.5)
    same = _update(tiny_dir, samples, temperature=0.5)
    assert same["planner/rollout_logp_diff_max"] < 1e-4
    assert same["searcher/rollout_logp_diff_max"] < 1e-4
    assert same["planner/rollout_kl"] < 1e-8
    at_one = _update(tiny_dir, samples, temperature=1.0)  # what main did: trained at T = 1
    assert at_one["planner/rollout_logp_diff_mean"] > 0.05  # ~0.1 (seed-dependent) vs < 1e-4


def test_rollout_is_reweights_the_policy_loss_by_the_truncated_ratio(tiny_dir):
    import math

    model, tok = load_model(tiny_dir)
    samples = _sampled(model, tok, 1.0, shift=0.3)  # the sampler says every token is likelier
    plain = _update(tiny_dir, samples)
    assert plain["planner/rollout_logp_diff_mean"] == pytest.approx(0.3, abs=1e-4)
    assert "rollout_is_mean" not in plain
    token = _update(tiny_dir, samples, rollout_is="token")
    w = math.exp(-0.3)  # pi_old / pi_rollout on every token, below the cap 2
    assert token["rollout_is_mean"] == pytest.approx(w, abs=1e-4)
    # rho = 1 on the first (only) step: pg_loss = mean(-A * w) = w * the unweighted one
    assert token["pg_loss"] == pytest.approx(w * plain["pg_loss"], rel=1e-4)
    seq = _update(tiny_dir, samples, rollout_is="sequence", rollout_is_threshold=1.0)
    assert seq["rollout_is_mean"] == pytest.approx(math.exp(-0.3 * 6), abs=1e-4)  # 6 tokens


@pytest.mark.parametrize("algorithm", ["at_grpo", "grpo"])
def test_kl_runs_for_every_embedded_algorithm(algorithm, tmp_path, tiny_dir, bench_dir):
    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, algorithm=algorithm, loss={"kl_coef": 0.1},
        stages=[{"stage": 1, "rounds": 1}]))
    assert run_training(cfg, progress=False).rounds == 1  # main: "needs ref_logprobs"
    (first,) = _round_metrics(tmp_path)
    assert first["planner/kl"] == pytest.approx(0.0, abs=1e-7)  # at the starting weights
    assert first["planner/entropy"] > 0


def test_policy_update_refuses_kl_without_a_reference_and_builds_it_once(tiny_dir):
    from types import SimpleNamespace

    from mgrpo.training.reference import reference_for

    model, tok = load_model(tiny_dir)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs the frozen reference model"):
        policy_update(model, None, _sampled(model, tok, 1.0), UpdateSpec(
            ModelConfig(path=str(tiny_dir)), LossConfig(kl_coef=0.1), tok.pad_token_id))
    lm = SimpleNamespace(name="m", model=model, ref_model=None)
    mcfg, on = ModelConfig(path=str(tiny_dir)), LossConfig(kl_coef=0.1)
    assert reference_for(lm, mcfg, LossConfig()) is None  # KL off: nothing loaded
    ref = reference_for(lm, mcfg, on)
    assert ref is lm.ref_model and reference_for(lm, mcfg, on) is ref
    assert ref is not model and not any(p.requires_grad for p in ref.parameters())


def test_kl_in_reward_lowers_each_reward_by_its_penalty(tmp_path, tiny_dir, bench_dir):
    """Same seed, same first round: with loss.kl_in_reward the planner's mean reward is the
    plain one minus the mean penalty kl_coef * sum_t k1_t (the reference another model, so
    the penalty is far from 0), and the loss has no KL term."""
    from mgrpo.models import TinyModelConfig, init_tiny

    other = init_tiny(tmp_path / "ref", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400, seed=7))
    firsts = []
    for name, loss in (("plain", {}), ("inr", {"kl_coef": 0.05, "kl_in_reward": True,
                                               "kl_estimator": "k1"})):
        data = run_config_dict(tmp_path / name, tiny_dir, bench_dir, loss=loss,
                               stages=[{"stage": 1, "rounds": 1}])
        data["models"]["planner"]["ref_path"] = str(other)
        run_training(RunConfig.model_validate(data), progress=False)
        (first,) = _round_metrics(tmp_path / name)
        firsts.append(first)
    plain, inr = firsts
    assert "planner/kl_penalty" not in plain and "planner/kl" not in inr  # no KL in the loss
    assert abs(inr["planner/kl_penalty"]) > 1e-3
    assert inr["planner/reward_mean"] == pytest.approx(
        plain["planner/reward_mean"] - inr["planner/kl_penalty"], abs=1e-6)


@pytest.mark.parametrize(("loss", "message"), [
    ({"kl_coef": 0.1, "kl_estimator": "k1"}, "k1 in the loss: its expected gradient is 0.*"
                                             "use k1\\+.*loss.kl_in_reward"),
    ({"kl_coef": 0.1, "kl_estimator": "k3"}, "reverse KL.*use k3\\+"),
    ({"kl_coef": 0.1, "kl_estimator": "k5"}, "k1', 'k2', 'k3', 'k1\\+' or 'k3\\+'"),
])
def test_kl_estimators_without_the_kl_gradient_are_refused_in_the_loss(loss, message):
    with pytest.raises(ValidationError, match=message):
        LossConfig(**loss)


def test_every_estimator_is_accepted_in_the_reward_and_while_kl_is_off():
    for name in ("k1", "k2", "k3", "k1+", "k3+"):
        LossConfig(kl_coef=0.1, kl_estimator=name, kl_in_reward=True)
        LossConfig(kl_estimator=name)


def test_reference_is_rebuilt_for_another_run_or_another_ref_path(tmp_path, tiny_dir):
    """A trainer service that moves from run A to run B (or sees ref_path change) must not
    keep A's reference."""
    from types import SimpleNamespace

    import torch

    from mgrpo.models import TinyModelConfig, init_tiny
    from mgrpo.training.reference import reference_for

    other = init_tiny(tmp_path / "other", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400, seed=7))
    model, _ = load_model(tiny_dir)
    lm = SimpleNamespace(name="m", model=model, ref_model=None)
    on = LossConfig(kl_coef=0.1)
    a = reference_for(lm, ModelConfig(path=str(tiny_dir)), on, run_id="A")
    assert reference_for(lm, ModelConfig(path=str(tiny_dir) + "/."), on, run_id="A") is a
    b = reference_for(lm, ModelConfig(path=str(other)), on, run_id="B")
    assert b is not a
    first = lambda m: next(iter(m.parameters()))  # noqa: E731
    assert not torch.equal(first(a), first(b))  # run B's own starting weights
    c = reference_for(lm, ModelConfig(path=str(other), ref_path=str(tiny_dir)), on, run_id="B")
    assert torch.equal(first(c), first(a))  # ref_path changed: that folder's weights
    assert reference_for(lm, ModelConfig(path=str(tiny_dir)), on, run_id="C") is not c


@pytest.mark.parametrize(("loss", "message"), [
    ({"kl_control": "adaptive", "kl_target": 6.0}, "kl_in_reward: true and loss.kl_coef > 0"),
    ({"kl_control": "adaptive", "kl_coef": 0.1, "kl_in_reward": True,
      "kl_estimator": "k1"}, "needs loss.kl_target"),
    ({"kl_control": "adaptive", "kl_coef": 0.1, "kl_in_reward": True, "kl_target": -1.0},
     "greater than 0"),
])
def test_adaptive_kl_control_needs_the_kl_in_the_reward_and_a_target(loss, message):
    with pytest.raises(ValidationError, match=message):
        LossConfig(**loss)


def test_adaptive_kl_coef_steps_each_round_and_resumes_with_the_optimizer(tmp_path, tiny_dir,
                                                                          bench_dir):
    """kl_control: adaptive, k3 (>= 0), reference another model (KL far above the target):
    round 2's
    coefficient is round 1's stepped by the rule with round 1's mean KL and trajectory count;
    a run stopped after round 1 and resumed uses the same round-2 coefficient."""
    from mgrpo.models import TinyModelConfig, init_tiny

    other = init_tiny(tmp_path / "ref", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400, seed=7))
    loss = {"kl_coef": 0.05, "kl_in_reward": True, "kl_estimator": "k3",
            "kl_control": "adaptive", "kl_target": 1e-3, "kl_horizon": 4}
    seconds = []
    for name, stop in (("whole", None), ("resumed", 1)):
        data = run_config_dict(tmp_path / name, tiny_dir, bench_dir, loss=loss,
                               stages=[{"stage": 1, "rounds": 2}])
        for model in data["models"].values():
            model["ref_path"] = str(other)
        cfg = RunConfig.model_validate(data)
        run_training(cfg, progress=False, stop_after=stop)
        if stop is not None:
            run_training(cfg, progress=False, resume=True)
        first, second = _round_metrics(tmp_path / name)
        seconds.append(second["planner/kl_coef"])
    assert first["planner/kl_coef"] == pytest.approx(0.05)
    # the planner model serves only the planner: its trajectories are the round's sequences
    n = first["planner/samples"]
    kl = first["planner/kl_penalty"] / 0.05
    assert kl > 1e-3  # above target: the coefficient grows by the clipped error 0.2
    assert seconds[0] == pytest.approx(0.05 * (1 + 0.2 * n / 4), rel=1e-9)
    assert seconds[1] == pytest.approx(seconds[0], rel=1e-12)


def test_adaptive_kl_coef_travels_with_the_trainer_services_optimizer_file(tmp_path, tiny_dir):
    """The trainer service's checkpoint (``.optimizer.pt`` named by the manifest) carries the
    coefficient; a fresh optimizer (a new run) starts from loss.kl_coef again."""
    from types import SimpleNamespace

    from mgrpo.models.checkpoint import save_checkpoint
    from mgrpo.parallel.optimizer_state import load_optimizer_state, save_optimizer_state
    from mgrpo.training.precision import fresh_optimizer
    from mgrpo.training.reference import current_kl_coef, update_kl_coef

    model, _ = load_model(tiny_dir)
    loss = LossConfig(kl_coef=0.1, kl_in_reward=True, kl_estimator="k3",
                      kl_control="adaptive", kl_target=2.0, kl_horizon=10)
    lm = SimpleNamespace(optimizer=torch.optim.Adam(model.parameters(), lr=0.1))
    # 5 sequences of KL 1.0 (penalty 0.1 * 1.0): e = -0.5 -> -0.2; 0.1 * (1 - 0.2 * 5 / 10)
    assert update_kl_coef(lm, loss, [0.1] * 5) == pytest.approx(0.09)
    root = str(tmp_path / "ck")
    extra = {"optimizer": save_optimizer_state(lm.optimizer, f"{root}/planner/v000001")}
    uri = save_checkpoint(model, root, "planner", 1, extra=extra)
    resumed = SimpleNamespace(optimizer=fresh_optimizer(lm.optimizer, model, 0.1))
    assert current_kl_coef(resumed, loss) == 0.1
    assert load_optimizer_state(resumed.optimizer, uri)
    assert current_kl_coef(resumed, loss) == pytest.approx(0.09)
    fixed = loss.model_copy(update={"kl_control": "fixed"})
    assert current_kl_coef(resumed, fixed) == 0.1 and update_kl_coef(resumed, fixed, [1.0]) == 0.1
