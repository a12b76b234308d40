"""The turn-team ablation configs (examples/ablate_team_*.yaml) load and every arm validates
as a turn_team run; arms of one name in the configs that share an out_dir are one setting
(a finished run is reused across them); `workflow.grouping` naive pools a shared model's
roles and turns into one group per task where agent_turn keeps each (task, role, turn)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mgrpo.experiments.team_ablate import arm_config, load_team_ablate
from mgrpo.training.tree_round import at_grpo_samples
from mgrpo.types import Trajectory

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CONFIGS = sorted(EXAMPLES.glob("ablate_team_*.yaml"))


def test_the_comparisons_have_configs():
    assert [p.stem.removeprefix("ablate_team_") for p in CONFIGS] == [
        "alpha", "grouping", "plan_path", "plan_path_alpha", "plan_path_grouping",
        "sharing_coder", "sharing_math", "single_agent", "swap"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_example_validates(path):
    cfg = load_team_ablate(path)
    assert cfg.test_tasks >= 200 and len(cfg.seeds) == 3 and cfg.warm_start is not None
    for arm in cfg.arms:
        run = arm_config(cfg, arm, 0)
        assert run.flow.name == "turn_team" and run.algorithm == "at_grpo"
        assert run.out_dir == str(Path(cfg.out_dir) / arm / "seed0")


def test_arms_of_one_name_are_one_setting_across_configs():
    seen: dict[tuple[str, str], str] = {}
    for path in CONFIGS:
        cfg = load_team_ablate(path)
        for arm in cfg.arms:
            run = arm_config(cfg, arm, 0).model_dump_json()
            assert seen.setdefault((cfg.out_dir, arm), run) == run, (path.name, arm)


def test_settings_of_the_arms():
    alpha = load_team_ablate(EXAMPLES / "ablate_team_alpha.yaml")
    assert [arm_config(alpha, a, 0).workflow.alpha for a in alpha.arms] == [0, 0.5, 1, 2]
    single = load_team_ablate(EXAMPLES / "ablate_team_single_agent.yaml")
    assert arm_config(single, "single", 0).workflow.roles == {"plan": "plan"}
    for name in ("sharing_coder", "sharing_math"):
        cfg = load_team_ablate(EXAMPLES / f"ablate_team_{name}.yaml")
        roles = {a: set(arm_config(cfg, a, 0).workflow.roles.values()) for a in cfg.arms}
        assert len(roles["specialised"]) == 2 and roles["shared"] == {"shared"}


def test_plan_path_team_has_the_grid_and_only_it_is_swapped(tmp_path, monkeypatch):
    from mgrpo.experiments import team_ablate

    cfg = load_team_ablate(EXAMPLES / "ablate_team_plan_path.yaml")
    team, single = arm_config(cfg, "team", 0), arm_config(cfg, "single", 0)
    assert team.workflow.world_options == {"grid_input": True}
    assert single.workflow.world == "plan_path_solo" and single.workflow.world_options == {}
    assert cfg.swap == ["tool", "plan"] and team.workflow.roles == {"tool": "tool",
                                                                    "plan": "plan"}
    swapped = []
    monkeypatch.setattr(team_ablate, "finished_run",
                        lambda out, rounds: {"before": {}, "after": {}})
    monkeypatch.setattr(team_ablate, "swapped_eval",
                        lambda run, roles, out: swapped.append(run.name) or {})
    monkeypatch.setattr(team_ablate, "team_markdown", lambda *a: "")
    small = cfg.model_copy(update={"seeds": [0], "warm_start": None,
                                   "out_dir": str(tmp_path)})
    results = team_ablate.run_team_ablation(small)
    assert swapped == ["team-s0"] and sorted(results) == ["single", "team", "team+swapped"]


def test_bad_configs_are_refused_in_one_line(tmp_path):
    data = yaml.safe_load((EXAMPLES / "ablate_team_grouping.yaml").read_text())
    data["arms"]["shared_naive"]["workflow"]["grouping"] = "roles"
    with pytest.raises(ValueError, match="arm shared_naive"):
        load_team_ablate(tmp_path / "x.yaml", data)
    data = yaml.safe_load((EXAMPLES / "ablate_team_swap.yaml").read_text())
    del data["swap"]  # one arm and nothing to compare it with
    with pytest.raises(ValueError, match="compares two arms or more"):
        load_team_ablate(tmp_path / "x.yaml", data)
    data = yaml.safe_load((EXAMPLES / "ablate_team_plan_path.yaml").read_text())
    del data["arms"]["team"]  # the single agent alone has no tool to swap
    data["arms"]["single2"] = data["arms"]["single"]
    with pytest.raises(ValueError, match=r"swap \['tool', 'plan'\]: no arm plays both roles"):
        load_team_ablate(tmp_path / "x.yaml", data)


def _traj(i: int, agent: str, turn: int, reward: float) -> Trajectory:
    return Trajectory(traj_id=f"t{i}", round_id="r", query_id="q0", rollout=i % 2,
                      agent=agent, model="shared", turn=turn, input_ids=[1, 2],
                      response_mask=[0, 1], old_logprobs=[0.0, 0.0], reward=reward)


def test_grouping_option_changes_the_group_keys():
    cfg = load_team_ablate(EXAMPLES / "ablate_team_grouping.yaml")
    rows = [("tool_user", 0, 1.0), ("tool_user", 0, 0.0), ("reasoner", 0, 1.0),
            ("reasoner", 0, 1.0), ("tool_user", 1, 2.0), ("tool_user", 1, 0.0)]
    trajs = [_traj(i, *row) for i, row in enumerate(rows)]
    groups = {}
    for arm in ("shared", "shared_naive"):
        samples, stats = at_grpo_samples(trajs, arm_config(cfg, arm, 0))
        groups[arm] = (len(stats), [round(s.advantage, 3) for s in samples])
    # agent_turn: (q0, tool_user, 0) [1, 0], (q0, reasoner, 0) [1, 1], (q0, tool_user, 1) [2, 0]
    assert groups["shared"] == (3, [1.0, -1.0, 0.0, 0.0, 1.0, -1.0])
    # naive: one group [1, 0, 1, 1, 2, 0] (mean 5/6 and its population std)
    # (its statistics filed under both roles that have samples in it)
    rewards = [r for _, _, r in rows]
    mean = sum(rewards) / 6
    std = (sum((r - mean) ** 2 for r in rewards) / 6) ** 0.5
    assert groups["shared_naive"] == (2, [round((r - mean) / std, 3) for r in rewards])


def test_pooled_groups_count_for_every_role_they_hold():
    """Under a pooled grouping a group's statistics are filed under each role with samples
    in it, keyed by the group (``*`` where pooled), so every role gets its
    ``frac_reward_zero_std``; agent_turn keeps one row per (task, role, turn)."""
    from mgrpo.training.scoring import frac_zero_std

    cfg = load_team_ablate(EXAMPLES / "ablate_team_grouping.yaml")
    rows = [("tool_user", 0, 1.0), ("tool_user", 0, 1.0), ("reasoner", 0, 1.0),
            ("reasoner", 0, 0.0), ("tool_user", 1, 1.0), ("tool_user", 1, 1.0)]
    trajs = [_traj(i, *row) for i, row in enumerate(rows)]
    _, naive = at_grpo_samples(trajs, arm_config(cfg, "shared_naive", 0))
    assert sorted((s.agent, s.group_key, s.n) for s in naive) == [
        ("reasoner", "q0|*|t*", 6), ("tool_user", "q0|*|t*", 6)]
    _, split = at_grpo_samples(trajs, arm_config(cfg, "shared", 0))
    assert sorted(s.group_key for s in split) == ["q0|reasoner|t0", "q0|tool_user|t0",
                                                   "q0|tool_user|t1"]
    by_role = {role: frac_zero_std([s for s in split if s.agent == role])
               for role in ("tool_user", "reasoner")}
    assert by_role == {"tool_user": 1.0, "reasoner": 0.0}
    assert {s.agent: frac_zero_std([s]) for s in naive} == {"tool_user": 0.0, "reasoner": 0.0}


def test_report_pairs_each_arm_with_the_baseline_and_its_swapped_team_once(tmp_path):
    from mgrpo.experiments.team_ablate import team_markdown
    from mgrpo.training.team_round import write_task_scores

    cfg = load_team_ablate(EXAMPLES / "ablate_team_sharing_math.yaml")
    cfg = cfg.model_copy(update={"swap": ["tool_user", "reasoner"], "seeds": [0]})
    scores = {"specialised": [1, 1, 0, 1], "shared": [0, 1, 0, 0],
              "specialised+swapped": [0, 0, 0, 0]}
    results = {}
    for arm, vals in scores.items():
        out = tmp_path / arm
        out.mkdir()
        write_task_scores(out, {f"task{i}": float(v) for i, v in enumerate(vals)})
        acc = {"eval/greedy/accuracy": sum(vals) / 4}
        results[arm] = [{"seed": 0, "before": {} if "+" in arm else acc, "after": acc,
                         "out_dir": str(out)}]
    text = team_markdown(cfg, results, 60.0)
    rows = [line for line in text.splitlines() if line.startswith("| specialised -")]
    assert [r.split(" | ")[:2] for r in rows] == [["| specialised - shared", "+0.500"],
                                                  ["| specialised - specialised+swapped",
                                                   "+0.750"]]
    assert "| specialised+swapped | - | 0.000 ± nan |" in text


def test_report_pairs_solved_tasks_and_partial_team_rewards_apart(tmp_path):
    """coder_tester's team reward is the fraction of hidden tests passed: an arm that passes
    half of them on every task solves none, as does one that passes none; the solved
    comparison is 0 and the team reward's +0.375, each in its own row."""
    from mgrpo.experiments.team_ablate import team_markdown
    from mgrpo.training.team_round import write_task_scores

    cfg = load_team_ablate(EXAMPLES / "ablate_team_sharing_coder.yaml")
    cfg = cfg.model_copy(update={"seeds": [0]})
    rewards = {"specialised": [0.5, 0.5, 0.5, 1.0], "shared": [0.0, 0.0, 0.0, 1.0]}
    results = {}
    for arm, vals in rewards.items():
        out = tmp_path / arm
        out.mkdir()
        write_task_scores(out, {f"task{i}": v for i, v in enumerate(vals)})
        after = {"eval/greedy/accuracy": 0.25, "eval/greedy/team_reward": sum(vals) / 4}
        results[arm] = [{"seed": 0, "before": after, "after": after, "out_dir": str(out)}]
    text = team_markdown(cfg, results, 60.0)
    rows = [line.split(" | ")[:2] for line in text.splitlines()
            if line.startswith("| specialised -")]
    assert rows == [["| specialised - shared", "+0.000"],
                    ["| specialised - shared (team reward)", "+0.375"]]
    assert "| specialised | 0.250 ± nan | 0.250 ± nan | 0.625 ± nan | 0.625 ± nan |" in text


def test_two_arms_with_the_same_settings_sample_the_same_rollouts(tiny_dir, tmp_path):
    """Arms differ in their settings alone: an arm's name (in its run's name and round ids)
    enters no sampling seed, so two arms of one setting play the same candidates."""
    from mgrpo.training.round_store import round_id_of
    from mgrpo.training.team_round import build_team_system
    from mgrpo.training.tree_round import tree_seed

    data = yaml.safe_load((EXAMPLES / "ablate_team_alpha.yaml").read_text())
    data.update(out_dir=str(tmp_path), arms={"specialised": {}, "specialised_copy": {}})
    data["base"]["sampling"] = {"max_new_tokens": 6}
    for model in data["base"]["models"].values():
        model["path"] = str(tiny_dir)
    cfg = load_team_ablate(tmp_path / "x.yaml", data)
    played = {}
    for arm in cfg.arms:
        run = arm_config(cfg, arm, 0)
        system = build_team_system(run)
        tasks = system.world.tasks("train", 2, run.seed)
        episodes = system.sampler().run(round_id_of(run.name, 0), tasks, tree_seed(run, 0))
        played[arm] = [(t.agent, t.turn, t.rollout, t.input_ids, t.reward)
                       for ep in episodes for t in ep.candidates]
    assert played["specialised"] == played["specialised_copy"]
    actions = {tuple(ids) for agent, _, _, ids, _ in played["specialised"]
               if agent == "tool_user"}
    assert len(actions) > 1  # sampled: the seeds matter


def test_report_resamples_seeds_then_tasks_and_says_how_many(tmp_path):
    """Three seeds of 4 tasks: the arms differ on every task of seed 0 (+1) and on none of
    seeds 1 and 2. Tasks then do not matter and a draw of 3 seeds has mean 0, 1/3, 2/3 or 1
    with p 0.296, 0.444, 0.222, 0.037: the 95% bootstrap interval is [0, 1]. (Pooling the
    12 (seed, task) pairs as one run gives [+0.083, +0.583], excluding 0.) Student-t over
    the seed differences (1, 0, 0): 1/3 +- 4.303 * 0.577 / sqrt(3) = [-1.101, +1.768]."""
    from mgrpo.experiments.team_ablate import team_markdown
    from mgrpo.training.team_round import write_task_scores

    cfg = load_team_ablate(EXAMPLES / "ablate_team_sharing_math.yaml")
    scores = {"specialised": [[1] * 4, [1, 0, 1, 0], [0, 0, 1, 1]],
              "shared": [[0] * 4, [1, 0, 1, 0], [0, 0, 1, 1]]}
    results = {}
    for arm, per_seed in scores.items():
        for seed, vals in enumerate(per_seed):
            out = tmp_path / arm / str(seed)
            out.mkdir(parents=True)
            write_task_scores(out, {f"s{seed}-task{i}": float(v) for i, v in enumerate(vals)})
            acc = {"eval/greedy/accuracy": sum(vals) / 4}
            results.setdefault(arm, []).append({"seed": seed, "before": acc, "after": acc,
                                                "out_dir": str(out)})
    text = team_markdown(cfg, results, 60.0)
    [row] = [line for line in text.splitlines() if line.startswith("| specialised - shared")]
    assert row == ("| specialised - shared | +0.333 | [+0.000, +1.000] | no | "
                   "[-1.101, +1.768] | +1.000, +0.000, +0.000 | 3 x 4 |")
