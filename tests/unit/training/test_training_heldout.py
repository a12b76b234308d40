"""`mgrpo eval` (issue 17.5, 17.7): a stage filter, --n that refuses to mix stages silently,
the run's trained checkpoints, another generator seed's benchmark beside the test split, and
each sub-agent's own correctness (r_expert) on held-out questions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from training_testkit import ScriptedEngine, run_config_dict
from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.envs import load_benchmark
from mgrpo.envs import protocol as P
from mgrpo.training.config import RunConfig
from mgrpo.training.evaluate import evaluate
from mgrpo.training.heldout import other_seed_benchmark, parse_stage, select_questions
from mgrpo.training.loop import run_training
from mgrpo.training.system import build_system


def test_select_questions_filters_stages_and_refuses_to_mix(bench):
    test = bench.questions("test")
    assert {q.stage for q in test} == {1, 2}  # the small benchmark mixes them
    with pytest.raises(ValueError, match=r"mix stages \(\d+ of stage 1, \d+ of stage 2\)"):
        select_questions(bench, "test", len(test), None)
    ones = select_questions(bench, "test", 1000, 1)
    assert ones == bench.questions("test", stage=1) and {q.stage for q in ones} == {1}
    assert [q.stage for q in select_questions(bench, "test", 3, 2)] == [2, 2, 2]
    assert select_questions(bench, "test", len(test), "all") == test
    first = test[0]  # one question never mixes
    assert select_questions(bench, "test", 1, None) == [first]
    assert parse_stage("2") == 2 and parse_stage("all") == "all" and parse_stage(None) is None
    with pytest.raises(ValueError, match="expected 1, 2 or all"):
        parse_stage("3")


def _config(tmp_path, tiny_dir, bench_dir, **overrides) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_config_dict(tmp_path, tiny_dir, bench_dir, **overrides)))
    return str(path)


def test_eval_cli_stage_option(tmp_path, tiny_dir, bench_dir):
    config = _config(tmp_path, tiny_dir, bench_dir)
    runner = CliRunner()
    mixed = runner.invoke(app, ["eval", "--config", config, "--n", "40"])
    assert mixed.exit_code == 1 and "mix stages" in mixed.output and "--stage" in mixed.output
    bad = runner.invoke(app, ["eval", "--config", config, "--stage", "3"])
    assert bad.exit_code == 2
    ok = runner.invoke(app, ["eval", "--config", config, "--n", "40", "--stage", "2"])
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.stdout[ok.stdout.index("{"):])
    n_stage2 = len(load_benchmark(bench_dir).questions("test", stage=2))
    assert out["stages"] == [2] and out["questions"] == min(40, n_stage2)
    assert out["weights"] == "models' paths" and 0 <= out["eval/greedy/accuracy"] <= 1
    # the config's eval_stage is the default
    config1 = _config(tmp_path, tiny_dir, bench_dir, eval_stage=1)
    ok1 = runner.invoke(app, ["eval", "--config", config1, "--n", "40"])
    assert ok1.exit_code == 0, ok1.output
    assert json.loads(ok1.stdout[ok1.stdout.index("{"):])["stages"] == [1]


def test_eval_cli_checkpoints_and_other_seed(tmp_path, tiny_dir, bench_dir):
    load_benchmark(bench_dir).save(tmp_path / "bench")  # its own copy: -seed5 lands beside
    config = _config(tmp_path, tiny_dir, tmp_path / "bench", eval_stage=1,
                     stages=[{"stage": 1, "rounds": 1}])
    runner = CliRunner()
    none = runner.invoke(app, ["eval", "--config", config, "--n", "4", "--checkpoints"])
    assert none.exit_code == 1 and "no checkpoints" in none.output
    run_training(RunConfig.model_validate(yaml.safe_load(Path(config).read_text())), progress=False)
    # the final evaluation keeps each question's correctness (paired comparisons, ablate)
    after = json.loads((tmp_path / "run" / "eval_after.json").read_text())
    per_q = json.loads((tmp_path / "run" / "eval_after_questions.json").read_text())
    assert set(per_q) == {"greedy", "sampled"} and len(per_q["greedy"]) == 2
    assert sum(per_q["greedy"].values()) / 2 == after["eval/greedy/accuracy"]
    res = runner.invoke(app, ["eval", "--config", config, "--n", "4", "--checkpoints",
                              "--bench-seed", "5"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert set(out) == {"seed 0", "seed 5", "name_overlap", "cpu"}
    assert out["seed 0"]["weights"] == out["seed 5"]["weights"] == {m: "t v1" for m in
                                                                    ("planner", "searcher",
                                                                     "coder")}
    assert out["seed 5"]["bench_dir"] == str(tmp_path / "bench-seed5")
    other = load_benchmark(tmp_path / "bench-seed5")
    assert other.config.seed == 5
    assert other.config.model_copy(update={"seed": 0}) == load_benchmark(bench_dir).config
    names0 = {e.name for e in load_benchmark(bench_dir).kg.entities}
    names5 = {e.name for e in other.kg.entities}
    assert names5 != names0 and 0.0 <= out["name_overlap"] < 0.5
    with pytest.raises(ValueError, match="seed 0 already"):
        other_seed_benchmark(bench_dir, 0, tmp_path / "x")


def searcher_questions(tmp_path, tiny_dir, bench_dir, n: int):
    """A system with short turn limits and the first ``n`` stage-1 test questions whose one
    subtask goes to the searcher."""
    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, sampling={"planner_max_turns": 3,
                                                 "subagent_max_turns": 3,
                                                 "max_new_tokens": 64}))
    system = build_system(cfg)
    return system, [q for q in system.bench.questions("test", stage=1)
                    if len(q.subtasks) == 1 and q.subtasks[0].agent == "searcher"][:n]


def test_r_expert_per_subagent_by_hand(tmp_path, tiny_dir, bench_dir, tokenizer):
    """A scripted planner delegates each question's gold subtask; the scripted searcher
    returns the gold answer for the first question and a wrong one for the second: the
    searcher's r_expert is 1/2, and accuracy too (the planner repeats what it got)."""
    system, qs = searcher_questions(tmp_path, tiny_dir, bench_dir, 2)
    gold = {qs[0].subtasks[0].task: qs[0].subtasks[0].answer, qs[1].subtasks[0].task: "0"}

    def planner(prompt, params):
        text = tokenizer.decode(prompt)
        if "<ret>" in text:
            result = text.rsplit("<ret>", 1)[1].split("</ret>", 1)[0].strip()
            return tokenizer.encode(P.render_answer(result), add_special_tokens=False)
        task = next(q.subtasks[0].task for q in qs if q.question in text)
        return tokenizer.encode(P.render_call("searcher", task), add_special_tokens=False)

    def searcher(prompt, params):
        text = tokenizer.decode(prompt)
        task = next(t for t in gold if t in text)
        return tokenizer.encode(P.render_return(gold[task]), add_special_tokens=False)

    system.runtimes["planner"] = replace(system.runtimes["planner"],
                                         engine=ScriptedEngine(tokenizer, planner))
    system.runtimes["searcher"] = replace(system.runtimes["searcher"],
                                          engine=ScriptedEngine(tokenizer, searcher))
    out = evaluate(system, qs, greedy=True)
    assert out["eval/greedy/calls_searcher"] == 1.0
    assert out["eval/greedy/r_expert_searcher"] == 0.5
    assert out["eval/greedy/accuracy"] == 0.5


def test_subagent_alone_on_gold_subtasks_by_hand(tmp_path, tiny_dir, bench_dir, tokenizer):
    """The searcher alone on three gold subtasks: right, wrong, and a broken turn ->
    r_expert 1/3, format valid 2/3; the planner plays no part."""
    from mgrpo.training.evaluate import evaluate_subagent

    system, qs = searcher_questions(tmp_path, tiny_dir, bench_dir, 3)
    replies = {qs[0].subtasks[0].task: P.render_return(qs[0].subtasks[0].answer),
               qs[1].subtasks[0].task: P.render_return("0"), qs[2].subtasks[0].task: "oops"}

    def searcher(prompt, params):
        text = tokenizer.decode(prompt)
        return tokenizer.encode(next(r for t, r in replies.items() if t in text),
                                add_special_tokens=False)

    system.runtimes["searcher"] = replace(system.runtimes["searcher"],
                                          engine=ScriptedEngine(tokenizer, searcher))
    out = evaluate_subagent(system, "searcher", qs, greedy=True)
    assert out == {"eval/greedy/searcher_alone/tasks": 3.0,
                   "eval/greedy/searcher_alone/r_expert": 1 / 3,
                   "eval/greedy/searcher_alone/format_valid": 2 / 3}
    assert evaluate_subagent(system, "coder", qs, greedy=False) == {
        "eval/sampled/coder_alone/tasks": 0.0}  # look-ups give the coder nothing


def test_eval_cli_shows_episodes_as_text(tmp_path, tiny_dir, bench_dir):
    """`mgrpo eval --episodes N`: the first N episodes as text on stderr (stdout stays the
    JSON), and with --out as JSON lines beside it."""
    config = _config(tmp_path, tiny_dir, bench_dir, eval_stage=1)
    done = CliRunner().invoke(app, [
        "eval", "--config", config, "--n", "3", "--episodes", "2", "--out",
        str(tmp_path / "eval.json")])
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout[done.stdout.index("{"):])
    assert "episodes" not in out and out["questions"] == 3
    questions = load_benchmark(bench_dir).questions("test", stage=1)[:2]
    shown = [line for line in done.stderr.splitlines() if line.startswith("episode ")]
    assert [line.split()[1] for line in shown] == [q.id for q in questions]
    assert f"question: {questions[0].question}   gold: {questions[0].answer}" in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "eval.episodes.jsonl").open()]
    assert [r["query_id"] for r in rows] == [q.id for q in questions]
    assert all(r["text"] in done.stderr for r in rows)
