"""Answer normalisation, exact match, the rule judge, the LLM-judge verifier, turn rewards."""

from __future__ import annotations

import pytest

from mgrpo.engines.base import Completion
from mgrpo.envs.arith import evaluate_arithmetic
from mgrpo.envs.protocol import PlannerAction
from mgrpo.envs.rewards import (
    ExactMatchVerifier,
    LLMJudgeVerifier,
    RuleExpertJudge,
    exact_match,
    normalize_answer,
    planner_turn_reward,
    searcher_turn_reward,
)


@pytest.mark.parametrize("raw, norm", [
    (" 48,213 ", "48213"), ("48213.0", "48213"), ("48213.", "48213"), ("-7", "-7"),
    ("3.50", "3.5"), ("The Varnholt.", "varnholt"), ("  Edda   Morlin ", "edda morlin"),
    ("TRUE", "true"), (None, ""), ("12345678901234567891", "12345678901234567891"),
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match():
    assert exact_match("48,213", "48213") == 1.0
    assert exact_match("48214", "48213") == 0.0
    assert exact_match("", "") == 0.0  # an empty answer never scores
    assert exact_match("12345678901234567891", "12345678901234567890") == 0.0
    assert ExactMatchVerifier().score("varnholt", "Varnholt") == 1.0


def test_arithmetic_is_safe():
    assert evaluate_arithmetic("48213 - 31002") == "17211"
    assert evaluate_arithmetic("1743 < 1802") == "True"
    assert evaluate_arithmetic("7 / 2") == "3.5"
    assert evaluate_arithmetic("max(3, 9) - -1") == "10"
    for bad in ("__import__('os')", "9**9**9", "x + 1", "1 +", "10**20 * 10**20 * 10**20",
                "1/0", "(" * 300 + "1" + ")" * 300):
        with pytest.raises(ValueError):
            evaluate_arithmetic(bad)


def test_rule_judge_numbers(small_bench):
    judge = RuleExpertJudge(small_bench)
    q = next(q for q in small_bench.questions("test") if q.kind == "arith")
    city = next(e for e in small_bench.kg.entities if e.type == "city" and not e.distractor)
    twin = next(e for e in small_bench.kg.entities if e.distractor)
    attr = next(iter(twin.attrs))
    pop = str(city.attrs["population"])
    assert judge.judge("searcher", f"population of {city.name}", pop) == 1.0
    assert judge.judge("searcher", f"population of {city.name}", str(int(pop) + 1)) == 0.0
    # Judged on the task it was GIVEN: a distractor's true value is right for that task.
    assert judge.judge("searcher", f"{attr} of {twin.name}", str(twin.attrs[attr])) == 1.0
    assert judge.judge("searcher", "population of Nowhere", "5") == 0.0
    assert judge.judge("searcher", "gibberish", "5") == 0.0
    assert judge.judge("coder", "48213 - 31002", "17211") == 1.0
    assert judge.judge("coder", "48213 - 31002", "17212") == 0.0
    assert judge.judge("coder", "1743 < 1802", "True") == 1.0
    assert judge.judge("coder", "population of X", "SyntaxError") == 0.0
    assert judge.judge("coder", q.subtasks[-1].task, q.subtasks[-1].answer) == 1.0
    assert judge.judge("searcher", "population of X", None) == 0.0


def test_rule_judge_without_kg_uses_gold_subtasks(small_bench):
    from mgrpo.envs import Benchmark

    user = Benchmark(small_bench.all_questions, small_bench.corpus, kg=None)
    judge = RuleExpertJudge(user)
    st = small_bench.questions("dev")[0].subtasks[0]
    assert judge.judge(st.agent, st.task, st.answer) == 1.0
    assert judge.judge(st.agent, st.task, st.answer + "0") == 0.0
    assert judge.judge("searcher", "population of Nowhere", "1") == 0.0


def test_turn_rewards(small_bench):
    q = next(q for q in small_bench.questions("train") if q.kind == "chain")
    first, second = q.subtasks[0], q.subtasks[1]
    assert planner_turn_reward(q, PlannerAction("call", first.agent, first.task)) == 1.0
    assert planner_turn_reward(q, f"<call>searcher|{second.task}</call>") == 1.0
    assert planner_turn_reward(q, PlannerAction("call", "coder", first.task)) == 0.0
    assert planner_turn_reward(q, PlannerAction("call", "searcher", "population of X")) == 0.0
    assert planner_turn_reward(q, f"<answer>{q.answer}</answer>") == 1.0
    assert planner_turn_reward(q, "<answer>nope</answer>") == 0.0
    assert planner_turn_reward(q, "garbage") == 0.0
    assert searcher_turn_reward(first, first.task, ["d9999", first.doc_id]) == 1.0
    assert searcher_turn_reward(first, first.task, ["d9999"]) == 0.0
    assert searcher_turn_reward(q, "x", [second.doc_id]) == 1.0
    assert searcher_turn_reward(q, "  ", [second.doc_id]) == 0.0
    with pytest.raises(TypeError, match="Question or a Subtask"):
        searcher_turn_reward("population of X", "q", [])


class _Tok:
    def encode(self, text):
        return [ord(c) % 256 for c in text]


class _Engine:
    version = 0

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []

    def generate(self, requests):
        self.prompts += [r.prompt_ids for r in requests]
        return [Completion(r.prompt_ids, [1], [0.0], self.replies.pop(0), "stop")
                for r in requests]


def test_llm_judge_verifier(tmp_path):
    engine = _Engine([" Yes.", "no", "maybe"])
    judge = LLMJudgeVerifier(engine, tokenizer=_Tok())
    assert judge.score("forty-eight thousand", "48000", "How many?") == 1.0
    assert judge.score_batch([("a", "b", None), ("48000", "48,000", None), ("c", "d", None)]) == \
        [0.0, 1.0, 0.0]  # the exact match short-cuts: two engine calls, not three
    assert len(engine.prompts) == 3
    bad = tmp_path / "p.txt"
    bad.write_text("no placeholders")
    with pytest.raises(ValueError, match="placeholder"):
        LLMJudgeVerifier(engine, bad, tokenizer=_Tok())
    with pytest.raises(ValueError, match="tokenizer"):
        LLMJudgeVerifier(engine)
