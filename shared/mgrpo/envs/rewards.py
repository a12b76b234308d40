"""Reward signals of the benchmark: correctness, the rule-based expert judge, turn rewards.

- ``exact_match``: 1.0 iff the normalised prediction equals the normalised gold (r_correct,
  paper Eq. 4). Normalisation: lower case, thousands separators and trailing ``.0`` dropped
  from numbers, other punctuation and the articles a/an/the removed, whitespace collapsed.
- ``RuleExpertJudge.judge(agent, task, result)``: r_expert (paper Eq. 5): 1.0 iff the
  sub-agent returned the true answer to THE TASK IT WAS GIVEN (not the planner's intended
  one): searcher tasks ``attribute of Entity`` are looked up in the knowledge graph
  (distractor entities included), coder tasks are evaluated with a safe ``ast`` walk.
- Verifiers (planner correctness): ``ExactMatchVerifier`` and ``LLMJudgeVerifier`` (an engine
  asked a yes/no question from ``prompts/llm_judge.txt``).
- AT-GRPO turn rewards: ``planner_turn_reward`` (a delegation that targets a gold subtask,
  or a correct answer) and ``searcher_turn_reward`` (the gold document was retrieved).

What this module does not do: combine rewards with weights (``mgrpo.algo.rewards``), check
formats (``mgrpo.envs.protocol``), or run tools.
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.envs.arith import evaluate_arithmetic, format_number
from mgrpo.envs.protocol import PlannerAction, parse_planner_turn
from mgrpo.envs.questions import Question, Subtask

DEFAULT_JUDGE_PROMPT = Path(__file__).parent / "prompts" / "llm_judge.txt"
_NUMBER_RE = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?|[-+]?\d+(\.\d+)?")
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str | None) -> str:
    """Canonical form for exact match: ``" 48,213.0 "`` -> ``"48213"``, ``"The Varnholt."``
    -> ``"varnholt"``, ``"True"`` -> ``"true"``."""
    if text is None:
        return ""
    body = str(text).strip().lower()
    number = body.rstrip(".").replace(",", "")
    if _NUMBER_RE.fullmatch(body.rstrip(".")):
        # int() where possible: float() would equate distinct integers beyond 2**53.
        return str(int(number)) if "." not in number else format_number(float(number))
    body = _ARTICLES_RE.sub(" ", body.translate(_PUNCT))
    return " ".join(body.split())


def exact_match(pred: str | None, gold: str) -> float:
    """1.0 iff ``normalize_answer(pred) == normalize_answer(gold)`` (an empty pred never
    matches)."""
    norm = normalize_answer(pred)
    return float(bool(norm) and norm == normalize_answer(gold))


class Verifier(Protocol):
    """Scores a final answer against the gold one, in [0, 1]."""

    def score(self, pred: str, gold: str, question: str | None = None) -> float: ...


class ExactMatchVerifier:
    def score(self, pred: str, gold: str, question: str | None = None) -> float:
        return exact_match(pred, gold)


class LLMJudgeVerifier:
    """Ask an engine whether ``pred`` means ``gold``; 1.0 iff the reply starts with ``yes``.

    ``tokenizer`` (``encode(text) -> ids``) defaults to ``engine.tokenizer``. Greedy, at most
    ``max_new_tokens`` tokens. An exact match short-cuts to 1.0 without calling the engine.
    """

    def __init__(self, engine: Any, prompt_path: str | Path = DEFAULT_JUDGE_PROMPT,
                 tokenizer: Any = None, max_new_tokens: int = 4):
        self.engine = engine
        self.template = Path(prompt_path).read_text(encoding="utf-8")
        for field in ("{question}", "{gold}", "{pred}"):
            if field not in self.template:
                raise ValueError(f"judge prompt {str(prompt_path)!r} lacks the placeholder "
                                 f"{field}; it needs {{question}}, {{gold}} and {{pred}}")
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("LLMJudgeVerifier needs a tokenizer: pass tokenizer=... or use an "
                             "engine with a .tokenizer attribute")
        self.max_new_tokens = max_new_tokens

    def score(self, pred: str, gold: str, question: str | None = None) -> float:
        return self.score_batch([(pred, gold, question)])[0]

    def score_batch(self, items: list[tuple[str, str, str | None]]) -> list[float]:
        scores: list[float | None] = [1.0 if exact_match(p, g) else None for p, g, _ in items]
        ask = [i for i, s in enumerate(scores) if s is None]
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        requests = [GenerationRequest(list(self.tokenizer.encode(self.template.format(
            question=items[i][2] or "", gold=items[i][1], pred=items[i][0] or ""))), params)
            for i in ask]
        completions = self.engine.generate(requests) if requests else []
        for i, completion in zip(ask, completions, strict=True):
            scores[i] = float(completion.text.strip().lower().startswith("yes"))
        return [float(s) for s in scores]


class RuleExpertJudge:
    """r_expert from ground truth. ``bench``: a Benchmark (its ``kg`` may be None for user
    data; then tasks are judged against the gold subtasks of its questions, others get 0)."""

    def __init__(self, bench: Any):
        self.kg = getattr(bench, "kg", None)
        self._gold: dict[tuple[str, str], str] = {}
        for q in getattr(bench, "all_questions", []):
            for st in q.subtasks:
                self._gold[(st.agent, normalize_answer(st.task))] = st.answer

    def truth(self, agent: str, task: str) -> str | None:
        """The true answer to ``task`` as given to ``agent``, or None if unknowable."""
        if agent == "coder":
            try:
                return evaluate_arithmetic(task)
            except ValueError:
                return None
        if agent == "searcher" and self.kg is not None:
            attr, sep, entity = task.strip().partition(" of ")
            if sep:
                fact = self.kg.fact(entity.strip(), attr.strip())
                if fact is not None:
                    return fact
        return self._gold.get((agent, normalize_answer(task)))

    def judge(self, agent: str, task: str, result: str | None) -> float:
        truth = self.truth(agent, task or "")
        return 0.0 if truth is None else exact_match(result, truth)


def planner_turn_reward(question: Question, action: PlannerAction | str,
                        solved: Collection[tuple[str, str]] = ()) -> float:
    """AT-GRPO local reward of one planner turn: a call scores 1.0 if it gives a gold
    subtask's text to that subtask's agent, unless that subtask is in ``solved`` (pairs of
    agent and :func:`normalize_answer`-ed task already answered correctly in this episode:
    repeating it is no progress, and paying for it would let looping beat answering); an
    answer scores its exact match; invalid 0."""
    if isinstance(action, str):
        action = parse_planner_turn(action)
    if action.kind == "answer":
        return exact_match(action.answer, question.answer)
    if action.kind == "call":
        task = normalize_answer(action.task)
        if (action.agent, task) in solved:
            return 0.0
        return float(any(st.agent == action.agent and normalize_answer(st.task) == task
                         for st in question.subtasks))
    return 0.0


def searcher_turn_reward(question_or_task: Question | Subtask, query: str,
                         retrieved_doc_ids: list[str]) -> float:
    """AT-GRPO local reward of one search: 1.0 if a gold document (of the subtask, or of any
    searcher subtask of the question) is among ``retrieved_doc_ids``; a blank query gets 0."""
    if isinstance(question_or_task, Question):
        gold = {st.doc_id for st in question_or_task.subtasks if st.doc_id}
    elif isinstance(question_or_task, Subtask):
        gold = {question_or_task.doc_id} if question_or_task.doc_id else set()
    else:
        raise TypeError(f"searcher_turn_reward takes a Question or a Subtask, got "
                        f"{type(question_or_task).__name__}")
    return float(bool(query and query.strip()) and bool(gold & set(retrieved_doc_ids)))
