"""Scoring by hand (K=4 planner groups, sub-agent rewards from outcomes, alignment to d),
the policy update (every parameter moves; micro-batch 1x8 == 8x1), RunConfig errors."""

from __future__ import annotations

import copy

import pytest
import torch

from mgrpo.store.records import PlannerOutcomeIn
from mgrpo.training.config import RunConfig
from mgrpo.training.scoring import Sample, planner_samples, subagent_rewards, subagent_samples
from mgrpo.training.update import UpdateSpec, policy_update
from mgrpo.types import Trajectory

MODELS = {m: {"path": "unused"} for m in ("planner", "searcher", "coder")}


def _traj(agent="planner", query="q0", rollout=0, invocation=0, n=6, **kw) -> Trajectory:
    ids = [5 + (i * 7 + rollout * 3 + invocation) % 50 for i in range(n)]
    return Trajectory(traj_id=f"r/{query}/{rollout}/{agent}/{invocation}", round_id="r",
                      query_id=query, rollout=rollout, agent=agent, model=agent,
                      invocation=invocation, input_ids=ids, response_mask=[0, 0] + [1] * (n - 2),
                      old_logprobs=[0.0] * n, **kw)


def _outcome(rollout, correct, fmt=True, query="q0"):
    reward = (0.1 + 0.9 * correct) if fmt else 0.0
    return PlannerOutcomeIn(query_id=query, rollout=rollout, attempt=0, format_ok=fmt,
                            correct=correct, reward=reward)


def test_planner_group_k4_by_hand():
    cfg = RunConfig(models=MODELS, k=4)
    outs = {(o.query_id, o.rollout): o for o in
            [_outcome(0, 0.0), _outcome(1, 1.0), _outcome(2, 0.0, fmt=False), _outcome(3, 1.0)]}
    samples, stats = planner_samples([_traj(rollout=k) for k in range(4)], outs, cfg)
    # rewards 0.1, 1.0, 0, 1.0: mu = 0.525, sigma^2 = (0.01+1+0+1)/4 - 0.525^2 = 0.226875
    sigma = 0.226875 ** 0.5
    expected = [(r - 0.525) / (sigma + 1e-6) for r in (0.1, 1.0, 0.0, 1.0)]
    assert [s.advantage for s in samples] == pytest.approx(expected, abs=1e-5)
    assert (stats[0].n, stats[0].mean) == (4, pytest.approx(0.525))
    assert stats[0].std == pytest.approx(sigma, abs=1e-6)


class _Judge:
    def judge(self, agent, task, result):
        return 1.0 if result == "ok" else 0.0


def test_subagent_rewards_read_the_planner_outcome():
    outs = {("q0", 0): _outcome(0, 1.0), ("q0", 1): _outcome(1, 0.0)}
    trajs = [_traj("searcher", rollout=0, result="ok", subtask="t"),
             _traj("searcher", rollout=1, result="ok", subtask="t"),
             _traj("searcher", rollout=1, invocation=1, result="no", subtask="t"),
             _traj("searcher", rollout=0, invocation=1, result="ok", format_ok=False)]
    # b = (0.1, 0.4, 0.5): 0.1 + 0.4*main + 0.5*expert, 0 when the format is invalid
    assert subagent_rewards(trajs, outs, _Judge(), (0.1, 0.4, 0.5)) == pytest.approx(
        [1.0, 0.6, 0.1, 0.0])


def test_subagent_alignment_to_d_by_hand():
    cfg = RunConfig(models=MODELS, k=3)
    # rollout 0 made two equal-reward calls, rollout 1 one, rollout 2 none (masked)
    trajs = [_traj("searcher", rollout=0), _traj("searcher", rollout=0, invocation=1),
             _traj("searcher", rollout=1)]
    rewards = [1.0, 1.0, 0.0]
    samples, stats = subagent_samples(trajs, rewards, k=3, d=1, cfg=cfg, seed=0)
    # d = 1: one of rollout 0's calls dropped -> live slots [1, 0]: mu 0.5, sigma 0.5
    assert sorted(s.advantage for s in samples) == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert (stats[0].n, stats[0].mean, stats[0].std) == (2, 0.5, 0.5)
    samples, stats = subagent_samples(trajs, rewards, k=3, d=2, cfg=cfg, seed=0)
    # d = 2: rollout 1's call duplicated -> [1, 1, 0, 0] (two samples of one trajectory)
    assert len(samples) == 4 and stats[0].n == 4
    assert sum(s.trajectory.rollout == 1 for s in samples) == 2
    assert sorted(s.advantage for s in samples) == pytest.approx([-1, -1, 1, 1], abs=1e-5)


def _samples(n=8):
    return [Sample(_traj(rollout=i, n=6 + i), advantage=(1.0 if i % 2 else -0.5), reward=0.0)
            for i in range(n)]


@pytest.fixture
def model(tiny_dir):
    from mgrpo.models import load_model

    return load_model(tiny_dir)[0]


def test_policy_update_changes_every_parameter(model, tokenizer):
    before = {k: v.clone() for k, v in model.named_parameters()}
    cfg = RunConfig(models=MODELS)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    metrics = policy_update(model, optimizer, _samples(), UpdateSpec(
        cfg.models["planner"], cfg.loss, tokenizer.pad_token_id))
    unchanged = [k for k, v in model.named_parameters() if torch.equal(v, before[k])]
    assert unchanged == []
    assert metrics["grad_norm"] > 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_1x8_equal_8x1(model, tokenizer, agg):
    cfg = RunConfig(models=MODELS, loss={"agg": agg})
    weights = []
    for micro in (1, 8):
        m = copy.deepcopy(model)
        mcfg = cfg.models["planner"].model_copy(update={"micro_batch_size": micro,
                                                        "grad_clip": 1e9})
        optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        policy_update(m, optimizer, _samples(), UpdateSpec(
            mcfg, cfg.loss, tokenizer.pad_token_id, norm_length=cfg.loss_norm_length()),
            generator=torch.Generator().manual_seed(0))
        weights.append(dict(m.named_parameters()))
    moved = max(float((weights[0][k] - p).detach().abs().max())
                for k, p in model.named_parameters())
    assert moved > 1e-4
    for key, value in weights[0].items():
        torch.testing.assert_close(value, weights[1][key], atol=2e-6, rtol=1e-5, msg=key)


@pytest.mark.parametrize("change, message", [
    ({"agents": {"planner": "big"}}, "agents map to models \\['big'\\]"),
    ({"agents": {"searcher": "searcher"}}, "must map the role `planner`"),
    ({"loss": {"eps_low": 1.0}}, "eps_low=1.0 must be < 1"),
])
def test_run_config_errors_say_value_rule_and_fix(change, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.model_validate({"models": MODELS, **change})


def test_run_config_rejects_k_below_2():
    with pytest.raises(ValueError, match="k"):
        RunConfig(models=MODELS, k=1)


def test_unknown_subagent_role_without_a_tool_is_a_clear_error():
    from mgrpo.training.system import build_tools

    with pytest.raises(ValueError, match="role_tools"):
        build_tools(bench=None, roles=["calendar"])
