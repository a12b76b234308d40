"""A turn_team round in embedded mode: AT-GRPO tree play on plan_path with scripted actions
(turn rewards, greedy continuation and (task, role, turn) advantages by hand; each role's
model trained, rows and metrics in the store), then one real round with the tiny model
through ``run_training``."""

from __future__ import annotations

import csv
from collections import Counter

import pytest
import torch
from training_testkit import ScriptedEngine

from mgrpo.envs.worlds import WorldTask
from mgrpo.training.config import RunConfig
from mgrpo.training.loop import run_training
from mgrpo.training.team_round import build_team_system, run_team_round
from mgrpo.training.tree_round import at_grpo_samples

TASK = WorldTask("hand", "train", "Grid 3x3 (S start, G goal, # wall; moves U D L R):\n"
                 "S..\n.#.\n..G", "RRDD", {"grid": ["S..", ".#.", "..G"]})
# Each role's answers cycle per prompt, in request order (K = 4). The planner's first
# answers to a prompt are the lookahead that finishes the team turn on each tool candidate
# (tool candidates 0 and 3 print the same output: RR, then RRDD), its next four its own
# candidates on the chosen tool output (junk, DR, RR, RRDD).
TOOL = ["<tool>print('RRDD')</tool>", "nonsense", "<tool>print('hello')</tool>",
        "<tool>print('RRDD')</tool>"]
PLAN = ["<answer>RR</answer>", "<answer>RRDD</answer>", "junk", "<answer>DR</answer>"]


def _scripted(tokenizer):
    seen: Counter = Counter()

    def respond(prompt, params):
        text = tokenizer.decode(prompt)
        options = TOOL if "You are the tool agent" in text else PLAN
        choice = options[seen[tuple(prompt)] % 4]
        seen[tuple(prompt)] += 1
        return tokenizer.encode(choice, add_special_tokens=False)

    return respond


def _cfg(tiny_dir, tmp_path, roles, **extra) -> RunConfig:
    return RunConfig.model_validate({
        "name": "team", "out_dir": str(tmp_path / "out"), "k": 4, "queries_per_round": 1,
        "report_to": [], "stages": [{"stage": None, "rounds": 1}],
        "sampling": {"max_new_tokens": 8}, "models": {m: {"path": str(tiny_dir), "lr": 1e-3}
                                                      for m in set(roles.values())},
        "workflow": {"kind": "turn_team", "world": "plan_path", "roles": roles, "alpha": 1.0,
                     "max_turns": 1}, **extra})


@pytest.fixture(scope="module")
def played(tiny_dir, tmp_path_factory):
    from mgrpo.store import Store

    tmp_path = tmp_path_factory.mktemp("team")
    store = Store(f"sqlite:///{tmp_path}/store.db")
    store.upgrade()
    cfg = _cfg(tiny_dir, tmp_path, {"tool": "a", "plan": "b"})
    system = build_team_system(cfg)
    for runtime in system.runtimes.values():  # the real models train; scripted actions
        runtime.engine = ScriptedEngine(runtime.tokenizer, _scripted(runtime.tokenizer))
    before = {n: [p.detach().clone() for p in lm.model.parameters()]
              for n, lm in system.models.items()}
    store.create_run("team", "team", {})
    metrics = run_team_round(system, store, "team", 0, [TASK])
    yield cfg, system, store, metrics, before
    store.close()


def test_turn_rewards_greedy_continuation_and_rows(played):
    cfg, system, store, metrics, _ = played
    tool = store.round_trajectories("team-r0000", "a")
    plan = store.round_trajectories("team-r0000", "b")
    assert {(t.agent, t.turn) for t in tool} == {("tool", 0)} and len(tool) == 4
    assert {(t.agent, t.turn) for t in plan} == {("plan", 0)} and len(plan) == 4
    by_k = {t.rollout: t for t in tool}
    # r = alpha * team + local: local 1.0 (the output solves it), 0.2 (ran), 0 (malformed);
    # team: the grid after the planner's lookahead answer (only candidate 3's, RRDD, solves)
    assert [by_k[k].extra["r_team"] for k in range(4)] == [0.0, 0.0, 0.0, 1.0]
    assert [by_k[k].reward for k in range(4)] == [1.0, 0.0, 0.2, 2.0]
    assert [by_k[k].extra["chosen"] for k in range(4)] == [False, False, False, True]
    by_k = {t.rollout: t for t in plan}
    # DR hits the wall after 1 of 4 steps (0.5 * 0.25); RR closes 2 (0.5 * 0.5); RRDD solves
    # (team 1 + local 1)
    assert [by_k[k].reward for k in range(4)] == [0.0, 0.125, 0.25, 2.0]
    assert [by_k[k].extra["r_team"] for k in range(4)] == [0.0, 0.0, 0.0, 1.0]
    assert by_k[3].extra["chosen"] and metrics["team/accuracy"] == 1.0
    # a candidate is its observation (mask 0) then its action (mask 1)
    t = by_k[3]
    n = sum(t.response_mask)
    text = system.runtimes["plan"].tokenizer.decode(t.input_ids[:-n])
    assert "Tool output: RRDD" in text and t.response_mask == [0] * (len(t.input_ids) - n) + [1] * n
    recorded = store.metrics("team")["team-r0000"]
    assert recorded["team/accuracy"] == 1.0 and recorded["plan/samples"] == 4
    assert store.get_round("team-r0000").status == "done"


def test_advantages_per_task_role_turn_by_hand(played):
    cfg, _, store, _, _ = played
    for model, rewards in (("a", [1.0, 0.0, 0.2, 2.0]), ("b", [0.0, 0.125, 0.25, 2.0])):
        samples, stats = at_grpo_samples(store.round_trajectories("team-r0000", model), cfg)
        mean = sum(rewards) / 4
        std = (sum((r - mean) ** 2 for r in rewards) / 4) ** 0.5
        got = {s.trajectory.rollout: s.advantage for s in samples}
        assert [got[k] for k in range(4)] == pytest.approx(
            [(r - mean) / (std + 1e-6) for r in rewards], abs=1e-6)
        assert len(stats) == 1 and stats[0].mean == pytest.approx(mean)
        if model == "a":  # mean 0.8, population std sqrt(0.62) = 0.78740
            assert [got[k] for k in range(4)] == pytest.approx(
                [0.25400, -1.01600, -0.76200, 1.52400], abs=1e-5)


def test_each_role_trains_its_own_model(played):
    _, system, _, metrics, before = played
    for name in ("a", "b"):
        after = list(system.models[name].model.parameters())
        assert any(not torch.equal(x, y) for x, y in zip(before[name], after, strict=True))
        assert metrics[f"{name}/grad_norm"] > 0
    assert metrics["tool/samples"] == 4 and metrics["plan/samples"] == 4
    assert metrics["tool/turn_reward_mean"] == pytest.approx(0.8)


def test_one_real_round_with_a_shared_policy(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path, {"tool": "m", "plan": "m"}, eval_questions=2,
               queries_per_round=2, k=2)
    cfg = cfg.model_copy(update={"workflow": cfg.workflow.model_copy(
        update={"train_tasks": 10, "max_turns": 2})})
    result = run_training(cfg, progress=False)
    assert result.rounds == 1 and "eval/greedy/accuracy" in result.after
    with open(tmp_path / "out" / "metrics.csv") as f:
        keys = {row["key"] for row in csv.DictReader(f)}
    assert {"team/accuracy", "tool/samples", "plan/samples", "m/entropy"} <= keys
    assert (tmp_path / "out" / "checkpoints").exists()


def test_a_stopped_turn_team_run_resumes_from_its_last_round(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path, {"tool": "m", "plan": "m"}, eval_questions=1, k=2,
               stages=[{"stage": None, "rounds": 2}])
    cfg = cfg.model_copy(update={"workflow": cfg.workflow.model_copy(
        update={"train_tasks": 4})})
    assert run_training(cfg, progress=False, stop_after=1).rounds == 1
    resumed = run_training(cfg, resume=True, progress=False)
    assert resumed.rounds == 2 and resumed.before == {} and resumed.after
    with open(tmp_path / "out" / "metrics.csv") as f:
        rounds = sorted({int(row["round"]) for row in csv.DictReader(f)
                         if row["key"] == "team/accuracy"})
    assert rounds == [0, 1]
