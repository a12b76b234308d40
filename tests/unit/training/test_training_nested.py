"""A nested hierarchy (planner -> researcher -> searcher, three models) trains one embedded
round: every level's trajectories reach the store, each role's advantages are its own
group-relative values (hand-computed here: one call per rollout, d = 1), and every level's
model moves. The delegation graph is checked when the config is read: a role calling itself,
a cycle or a second caller are refused in one line; the services take a nested config."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from training_testkit import ScriptedEngine, run_config_dict, text_responder

from mgrpo.training.config import RunConfig
from mgrpo.validation import one_line

NESTED = {"planner": {"model": "planner", "calls": ["researcher"]},
          "researcher": {"model": "researcher", "calls": ["searcher"]},
          "searcher": "searcher"}


def _cfg(tmp_path, tiny_dir, bench_dir, **over) -> RunConfig:
    data = run_config_dict(tmp_path, tiny_dir, bench_dir, **{
        "agents": NESTED, "k": 4, "d": 1, "rewards": {"subagent": [0.2, 0.8, 0.0]}, **over})
    data["models"] = {m: {"path": str(tiny_dir), "lr": 1e-2, "micro_batch_size": 8}
                      for m in ("planner", "researcher", "searcher")}
    return RunConfig.model_validate(data)


def _between(text: str, start: str, end: str) -> str:
    return text.rsplit(start, 1)[1].split(end, 1)[0]


def test_three_levels_train_one_embedded_round(tmp_path, tiny_dir, bench_dir, monkeypatch):
    from mgrpo.store import Store
    from mgrpo.training import rounds
    from mgrpo.training.loop import round_id_of, run_round, stage_pool
    from mgrpo.training.system import build_system

    cfg = _cfg(tmp_path, tiny_dir, bench_dir)
    assert cfg.agents == {"planner": "planner", "researcher": "researcher",
                          "searcher": "searcher"}
    assert cfg.delegation == {"planner": ["researcher"], "researcher": ["searcher"]}
    assert cfg.flow.turn_order(cfg) == {"planner": ("researcher",),
                                        "researcher": ("searcher", "planner"),
                                        "searcher": ("researcher",)}
    system = build_system(cfg)
    assert set(system.tools) == {"searcher"}  # the researcher's tool is its sub-agent
    gold = {q.question: q.answer for q in system.bench.all_questions}

    def planner(text, params):  # delegate the question, then answer by the researcher's word
        if "<ret>" not in text.split("<|planner|>", 1)[1]:
            return f"<call>researcher|{_between(text, '<|question|>', '<|planner|>')}</call>"
        question = _between(text, "<|question|>", "<|planner|>")
        found = _between(text, "<ret>", "</ret>") == "found"
        return f"<answer>{gold[question] if found else 'x'}</answer>"

    def researcher(text, params):  # pass the task on, then return what came back
        assert text.startswith("<|agents|>searcher: look up facts<|task|>")
        if "<ret>" not in text:
            return f"<call>searcher|{_between(text, '<|task|>', '<|researcher|>')}</call>"
        return f"<return>{_between(text, '<ret>', '</ret>')}</return>"

    def searcher(text, params):  # found or not, by the call's seed
        return "<return>found</return>" if params.seed % 3 else "<return>lost</return>"

    for role, turn in (("planner", planner), ("researcher", researcher),
                       ("searcher", searcher)):
        rt = system.runtimes[role]
        rt.engine = ScriptedEngine(rt.tokenizer, text_responder(rt.tokenizer, turn))
    before = {n: [p.detach().clone() for p in lm.model.parameters()]
              for n, lm in system.models.items()}
    seen: dict[str, list] = {}
    real_update = rounds.update_model

    def spy(lm, samples, cfg, round_index):
        seen[lm.name] = list(samples)
        return real_update(lm, samples, cfg, round_index)

    monkeypatch.setattr(rounds, "update_model", spy)
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    metrics = run_round(system, store, cfg.name, 0, stage_pool(system, 0))

    round_id = round_id_of(cfg.name, 0)
    episodes = cfg.queries_per_round * cfg.k
    trajs = {m: store.round_trajectories(round_id, m) for m in system.models}
    assert {m: len(t) for m, t in trajs.items()} == dict.fromkeys(trajs, episodes)
    for traj in trajs["researcher"]:  # level 2 delegated, saw the result, returned it
        assert traj.format_ok and traj.invocation == 0 and traj.result in ("found", "lost")
    for traj in trajs["searcher"]:  # level 3: call 0 of researcher invocation 0
        assert traj.format_ok and traj.invocation == 0 and traj.subtask in gold
    assert metrics["researcher/calls_per_episode"] == metrics["searcher/calls_per_episode"] == 1
    outcomes = {(o.query_id, o.rollout): o for o in store.read_planner_outcomes(round_id)}
    assert 0 < sum(o.correct for o in outcomes.values()) < episodes

    eps = cfg.loss.eps
    for model, (fmt, main) in (("planner", (0.1, 0.9)), ("researcher", (0.2, 0.8)),
                               ("searcher", (0.2, 0.8))):
        by_query: dict[str, list[tuple[int, float]]] = {}
        for traj in trajs[model]:  # hand-computed: R = fmt + main * r_correct_main
            o = outcomes[(traj.query_id, traj.rollout)]
            by_query.setdefault(traj.query_id, []).append((traj.rollout, fmt + main * o.correct))
        expected = {}
        for qid, rows in by_query.items():
            rewards = [r for _, r in rows]
            mean = sum(rewards) / len(rewards)
            std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
            for rollout, r in rows:
                expected[(qid, rollout)] = (r - mean) / (std + eps)
        got = {(s.trajectory.query_id, s.trajectory.rollout): s.advantage
               for s in seen[model]}
        assert len(seen[model]) == episodes and got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-5), (model, key)
        assert any(abs(v) > 0.5 for v in expected.values())
        moved = any(not torch.equal(a, b) for a, b in
                    zip(before[model], system.models[model].model.parameters(), strict=True))
        assert moved, f"{model}'s weights did not change"


@pytest.mark.parametrize("agents, message", [
    ({"planner": "p", "researcher": {"model": "p", "calls": ["researcher"]}},
     "agents.researcher.calls lists researcher itself: an agent delegates to other agents only"),
    ({"planner": "p", "researcher": {"model": "p", "calls": ["searcher"]},
      "searcher": {"model": "p", "calls": ["researcher"]}, "coder": "p"},
     "agents: delegation cycle researcher -> searcher -> researcher; the agents that call "
     "each other must form a tree under the planner"),
    ({"planner": {"model": "p", "calls": ["researcher", "searcher"]},
      "researcher": {"model": "p", "calls": ["searcher"]}, "searcher": "p"},
     "agents: searcher is called by planner and researcher; each sub-agent has one caller "
     "(its group is its caller's calls)"),
    ({"planner": "p", "researcher": {"model": "p", "calls": ["planner"]}},
     "agents.researcher.calls: 'planner' is not a sub-agent role of `agents` "
     "(['researcher'])"),
    ({"planner": "p", "a": {"model": "p", "calls": ["b"]}, "b": {"model": "p", "calls": ["c"]},
      "c": {"model": "p", "calls": ["d"]}, "d": {"model": "p", "calls": ["e"]}, "e": "p"},
     "agents: delegation 5 levels below the planner; at most 4"),
])
def test_a_bad_delegation_graph_is_refused_in_one_line(tmp_path, agents, message):
    data = {"agents": agents, "models": {"p": {"path": str(tmp_path)}},
            "role_tools": {r: "search" for r in ("a", "b", "c", "d", "e")}}
    with pytest.raises(ValidationError) as caught:
        RunConfig.model_validate(data)
    assert one_line(caught.value) == f"invalid RunConfig: {message}"


def test_nesting_needs_mgrpo_and_runs_through_the_services(tmp_path, tiny_dir, bench_dir):
    """The services take a nested hierarchy (``mgrpo up`` starts a worker per sub-agent at
    every level: the delegating one without a tool, and a trainer per model); a command that
    plays one level of sub-agents with one teacher (transcripts) still refuses it."""
    import yaml

    from mgrpo.cli.up import service_commands
    from mgrpo.workflows import refuse_embedded_only, refuse_outside_services

    with pytest.raises(ValueError, match=r"nested delegation trains with algorithm mgrpo "
                       r"\(planner \+ sub-agents, per-agent groups with alignment\), "
                       r"not at_grpo"):
        _cfg(tmp_path, tiny_dir, bench_dir, algorithm="at_grpo")
    cfg = _cfg(tmp_path, tiny_dir, bench_dir)
    refuse_outside_services(cfg)  # what every service runs on MGRPO_RUN_CONFIG
    refuse_outside_services(cfg, "mgrpo up")
    refuse_embedded_only(cfg, "mgrpo eval", nested=True)  # played in this process
    with pytest.raises(ValueError) as caught:
        refuse_embedded_only(cfg, "mgrpo data transcripts")
    assert str(caught.value) == (
        "mgrpo data transcripts cannot play nested delegation ({'researcher': ['searcher']}): "
        "it plays one level of sub-agents; a nested hierarchy trains with `mgrpo train` or "
        "the services and is measured with `mgrpo eval`")
    path = tmp_path / "nested.yaml"
    data = run_config_dict(tmp_path, tiny_dir, bench_dir, agents=NESTED)
    data["models"] = {m: {"path": str(tiny_dir)} for m in ("planner", "researcher", "searcher")}
    path.write_text(yaml.safe_dump(data))
    commands = dict(service_commands(str(path), 8000))
    assert list(commands) == ["planner", "planner-worker", "subagent-researcher",
                              "subagent-searcher", "trainer-planner", "trainer-researcher",
                              "trainer-searcher"]
    assert commands["subagent-researcher"] == ["serve", "subagent", "--name", "researcher",
                                               "--model", str(tiny_dir)]
    assert commands["subagent-searcher"] == ["serve", "subagent", "--name", "searcher",
                                             "--tool", "search", "--model", str(tiny_dir)]
    flat = _cfg(tmp_path, tiny_dir, bench_dir,
                agents={"planner": "planner", "searcher": "searcher"})
    refuse_outside_services(flat)  # one level: the services play it
    refuse_embedded_only(flat, "mgrpo up")
    assert flat.delegation == {}
