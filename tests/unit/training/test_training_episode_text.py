"""Episodes as people read them (``mgrpo.training.episode_text``): a scripted episode's
every turn, tool call and result, and its rewards, as text; an embedded run writes a few per
round to completions.jsonl and TensorBoard's text tab."""

from __future__ import annotations

import json
from types import SimpleNamespace

from test_training_runner import _play
from training_testkit import run_config_dict

from mgrpo.training.episode_text import episode_record, render_episode, sample_records


def test_an_episode_reads_turn_by_turn_with_tool_calls_results_and_rewards(bench, tools,
                                                                          tokenizer):
    question, ep = _play(bench, tools, tokenizer)
    observation = tools["searcher"].run("Velmora")
    record = episode_record(ep, SimpleNamespace(correct=0.0, reward=0.2), expert=[1.0, 0.0])
    assert json.loads(json.dumps(record)) == record  # a JSON line as it is
    assert record["text"] == render_episode(record)
    lines = record["text"].splitlines()
    assert lines[0] == f"episode {question.id} #0   reward 0.2  correct 0  format ok"
    assert lines[1] == f"question: {question.question}   gold: {question.answer}"
    call = ["  searcher calls search: Velmora", f"    = {' '.join(observation.split())}"]
    assert lines[2:] == [
        "planner -> searcher: task a", *call,
        "  searcher returns: v1   (format ok, r_expert 1)",
        "planner -> searcher: task b", *call,
        "  searcher returns: v1   (format ok, r_expert 0)",
        "planner answers: done"]


def test_a_broken_turn_shows_the_models_text():
    record = {"query_id": "q", "rollout": 1, "question": "2+2?", "gold": "4", "answer": None,
              "format_ok": False, "correct": 0.0, "reward": 0.0, "calls": [],
              "steps": [{"agent": "planner", "raw": "<call>nobody", "error": "not a valid "
                         "planner turn"}]}
    assert render_episode(record).splitlines()[2] == (
        "planner: not a valid planner turn: '<call>nobody'")


def test_the_sample_is_seeded_and_in_order():
    items = list(range(10))
    assert sample_records(items, 3, seed=4) == sample_records(items, 3, seed=4)
    picked = sample_records(items, 3, seed=4)
    assert picked == sorted(picked) and len(picked) == 3
    assert sample_records(items, 0, seed=4) == [] and sample_records(items, 20, 1) == items


def test_training_writes_a_few_completions_per_round(tmp_path, tiny_dir, bench_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import run_training

    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, log_completions=2, eval_questions=1))
    run_training(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").open()]
    assert [r["round"] for r in rows] == [0, 0, 1, 1]
    assert all(r["text"].startswith(f"episode {r['query_id']} #{r['rollout']}") for r in rows)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"),
                              size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("completions/text_summary")
    assert [t.step for t in texts] == [0, 1]
    assert rows[0]["question"] in texts[0].tensor_proto.string_val[0].decode()
    quiet = RunConfig.model_validate(run_config_dict(
        tmp_path / "q", tiny_dir, bench_dir, log_completions=0, eval_questions=1,
        stages=[{"stage": 1, "rounds": 1}]))
    run_training(quiet, progress=False)
    assert not (tmp_path / "q" / "run" / "completions.jsonl").exists()


def test_completions_go_to_a_wandb_table(tmp_path, monkeypatch):
    import sys

    from mgrpo.training.metrics import COMPLETION_COLUMNS, MetricsLogger

    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    run = SimpleNamespace(log=lambda values, step: logged.append((step, values)),
                          finish=lambda: None, dir=str(tmp_path))
    fake = SimpleNamespace(init=lambda **kwargs: run, Table=Table)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    logger = MetricsLogger(tmp_path, enabled=False, report_to=["wandb"])
    record = {"query_id": "q", "rollout": 0, "reward": 1.0, "correct": 1.0,
              "format_ok": True, "text": "episode q #0"}
    logger.log_completions(3, [record])
    logger.close()
    ((step, values),) = logged
    table = values["completions"]
    assert step == 3 and table.columns == list(COMPLETION_COLUMNS)
    assert table.data == [[3, "q", 0, 1.0, 1.0, True, "episode q #0"]]
