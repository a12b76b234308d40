"""Questions synthesised by walks on the knowledge graph, each with its gold decomposition.

Kinds (stage 1 is ``lookup`` only; stage 2 the rest):

- ``lookup``:  one searcher subtask, ``population of Varnholt``.
- ``chain``:   2-3 searcher subtasks, each naming the entity the previous one returned.
- ``compare``: two look-ups then a coder comparison ``48213 > 31002`` (``True``/``False``);
  the answer is ``options[0]`` if the comparison is ``True`` else ``options[1]``.
- ``arith``:   look-ups then a coder expression ``48213 - 31002``; the answer is its value.

Every subtask carries a ``template`` over the results of earlier subtasks (``{r0}``,
``{r1}`` ...) so a policy that got an earlier step wrong asks the next question about what it
actually got; ``task`` is the template filled with the gold results.

What this module does not do: split the entities (``mgrpo.envs.kg`` does) or save files.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, Field

from mgrpo.envs.kg import KnowledgeGraph

Kind = Literal["lookup", "chain", "compare", "arith"]
KINDS: tuple[str, ...] = ("lookup", "chain", "compare", "arith")


class Subtask(BaseModel):
    agent: str  # the sub-agent role: searcher, coder ...
    task: str  # canonical text, filled with gold results: "population of Varnholt"
    answer: str  # ground truth of THIS subtask (r_expert, AT-GRPO turn rewards)
    doc_id: str | None = None  # the document holding the fact (searcher subtasks)
    template: str | None = None  # task over earlier results: "population of {r0}"


class Question(BaseModel):
    id: str
    question: str
    answer: str
    stage: int = Field(1, ge=1, le=2)
    kind: str = "lookup"
    split: str = "train"
    subtasks: list[Subtask] = Field(default_factory=list)
    options: list[str] | None = None  # compare: answer = options[0] if True else options[1]


LOOKUPS: dict[tuple[str, str], str] = {
    ("city", "population"): "What is the population of {e}?",
    ("city", "founded"): "In which year was {e} founded?",
    ("city", "country"): "In which country is {e}?",
    ("person", "birth year"): "In which year was {e} born?",
    ("person", "birthplace"): "In which city was {e} born?",
    ("person", "employer"): "Which company does {e} work at?",
    ("company", "employees"): "How many employees does {e} have?",
    ("company", "founded"): "In which year was {e} founded?",
    ("company", "headquarters"): "In which city is {e} headquartered?",
    ("company", "founder"): "Who founded {e}?",
}

# (start type, attributes followed in order, question). The last attribute is the answer.
CHAINS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("person", ("birthplace", "population"), "What is the population of the city where {e} was born?"),  # noqa: E501
    ("person", ("birthplace", "country"), "In which country was {e} born?"),
    ("person", ("birthplace", "founded"), "In which year was the birthplace of {e} founded?"),
    ("person", ("employer", "employees"), "How many employees does the employer of {e} have?"),
    ("person", ("employer", "founded"), "In which year was the employer of {e} founded?"),
    ("person", ("employer", "headquarters"), "In which city is the employer of {e} headquartered?"),
    ("company", ("headquarters", "population"), "What is the population of the city where {e} is headquartered?"),  # noqa: E501
    ("company", ("headquarters", "country"), "In which country is {e} headquartered?"),
    ("company", ("founder", "birth year"), "In which year was the founder of {e} born?"),
    ("company", ("founder", "birthplace"), "In which city was the founder of {e} born?"),
    ("person", ("employer", "headquarters", "population"), "What is the population of the city where the employer of {e} is headquartered?"),  # noqa: E501
    ("company", ("founder", "birthplace", "country"), "In which country was the founder of {e} born?"),  # noqa: E501
    ("person", ("employer", "founder", "birth year"), "In which year was the founder of the employer of {e} born?"),  # noqa: E501
)

# (type, attribute, operator, question). Comparisons answer with a name, arithmetic with a
# number; for "-" the pair is ordered so that the result is positive.
COMPARES: tuple[tuple[str, str, str, str], ...] = (
    ("city", "population", ">", "Which city has the larger population, {a} or {b}?"),
    ("city", "founded", "<", "Which city was founded earlier, {a} or {b}?"),
    ("person", "birth year", "<", "Who was born earlier, {a} or {b}?"),
    ("company", "employees", ">", "Which company has more employees, {a} or {b}?"),
    ("company", "founded", "<", "Which company was founded earlier, {a} or {b}?"),
)
ARITHS: tuple[tuple[str, str, str, str], ...] = (
    ("city", "population", "-", "How many more people live in {a} than in {b}?"),
    ("city", "population", "+", "What is the combined population of {a} and {b}?"),
    ("city", "founded", "-", "How many years after {b} was {a} founded?"),
    ("company", "employees", "-", "How many more employees does {a} have than {b}?"),
    ("company", "employees", "+", "How many employees do {a} and {b} have together?"),
    ("person", "birth year", "-", "How many years older is {b} than {a}?"),
)
FOUNDER_AGE = "How old was the founder of {e} when {e} was founded?"


def lookup_task(attr: str, entity: str) -> str:
    """The canonical searcher subtask text."""
    return f"{attr} of {entity}"


def _search(kg: KnowledgeGraph, attr: str, entity: str, template: str) -> Subtask:
    answer = kg.fact(entity, attr)
    assert answer is not None, (entity, attr)
    found = kg.get(entity)
    return Subtask(agent="searcher", task=lookup_task(attr, entity), answer=answer,
                   doc_id=found.doc_id if found else None, template=template)


def _code(expression: str, template: str) -> Subtask:
    # here, not at the top: an import circle through mgrpo.envs.arith
    from mgrpo.envs.arith import evaluate_arithmetic

    return Subtask(agent="coder", task=expression, answer=evaluate_arithmetic(expression),
                   template=template)


def all_lookups(kg: KnowledgeGraph, split: str) -> list[tuple[str, list[Subtask], str]]:
    """Every one-hop question of a split: ``(question, subtasks, answer)``."""
    out = []
    for (type_, attr), phrase in LOOKUPS.items():
        for entity in kg.real(split, type_):  # type: ignore[arg-type]
            sub = _search(kg, attr, entity.name, lookup_task(attr, entity.name))
            out.append((phrase.format(e=entity.name), [sub], sub.answer))
    return out


def make_chain(kg: KnowledgeGraph, split: str, rng: random.Random):
    type_, attrs, phrase = rng.choice(CHAINS)
    start = rng.choice(kg.real(split, type_)).name  # type: ignore[arg-type]
    subtasks, current = [], start
    for i, attr in enumerate(attrs):
        template = lookup_task(attr, start if i == 0 else f"{{r{i - 1}}}")
        subtasks.append(_search(kg, attr, current, template))
        current = subtasks[-1].answer
    return phrase.format(e=start), subtasks, current, None


def _pair(kg: KnowledgeGraph, split: str, type_: str, attr: str, rng: random.Random):
    a, b = rng.sample(kg.real(split, type_), 2)  # type: ignore[arg-type]
    return a.name, b.name, int(a.attrs[attr]), int(b.attrs[attr])


def make_compare(kg: KnowledgeGraph, split: str, rng: random.Random):
    type_, attr, op, phrase = rng.choice(COMPARES)
    a, b, va, vb = _pair(kg, split, type_, attr, rng)
    if va == vb:
        return None  # no single right answer
    subtasks = [_search(kg, attr, a, lookup_task(attr, a)),
                _search(kg, attr, b, lookup_task(attr, b))]
    subtasks.append(_code(f"{va} {op} {vb}", f"{{r0}} {op} {{r1}}"))
    answer = a if subtasks[-1].answer == "True" else b
    return phrase.format(a=a, b=b), subtasks, answer, [a, b]


def make_arith(kg: KnowledgeGraph, split: str, rng: random.Random):
    if rng.random() < 1 / (len(ARITHS) + 1):
        return _founder_age(kg, split, rng)
    type_, attr, op, phrase = rng.choice(ARITHS)
    a, b, va, vb = _pair(kg, split, type_, attr, rng)
    if op == "-" and va <= vb:
        if va == vb:
            return None
        a, b, va, vb = b, a, vb, va
    subtasks = [_search(kg, attr, a, lookup_task(attr, a)),
                _search(kg, attr, b, lookup_task(attr, b))]
    subtasks.append(_code(f"{va} {op} {vb}", f"{{r0}} {op} {{r1}}"))
    return phrase.format(a=a, b=b), subtasks, subtasks[-1].answer, None


def _founder_age(kg: KnowledgeGraph, split: str, rng: random.Random):
    company = rng.choice(kg.real(split, "company")).name
    founder = _search(kg, "founder", company, lookup_task("founder", company))
    born = _search(kg, "birth year", founder.answer, lookup_task("birth year", "{r0}"))
    founded = _search(kg, "founded", company, lookup_task("founded", company))
    code = _code(f"{founded.answer} - {born.answer}", "{r2} - {r1}")
    return FOUNDER_AGE.format(e=company), [founder, born, founded, code], code.answer, None


MAKERS = {"chain": make_chain, "compare": make_compare, "arith": make_arith}


def generate_split(kg: KnowledgeGraph, split: str, n: int, stage1_fraction: float,
                   rng: random.Random) -> list[Question]:
    """``n`` questions of one split: ``round(n * stage1_fraction)`` look-ups, the rest stage 2.

    Look-ups are drawn without replacement from all one-hop facts (cycled if more are asked
    than exist); stage-2 kinds rotate chain, compare, arith; duplicates of a question text
    are re-drawn (up to 50 tries, then kept).
    """
    n1 = round(n * stage1_fraction)
    pool = all_lookups(kg, split)
    rng.shuffle(pool)
    rows = [(pool[i % len(pool)], 1, "lookup", None) for i in range(n1)]
    seen = {r[0][0] for r in rows}
    for i in range(n - n1):
        kind = ("chain", "compare", "arith")[i % 3]
        made = None
        for _ in range(50):
            made = MAKERS[kind](kg, split, rng)
            if made is not None and made[0] not in seen:
                break
        assert made is not None, f"could not make a {kind} question"
        seen.add(made[0])
        rows.append(((made[0], made[1], made[2]), 2, kind, made[3]))
    questions = []
    for i, ((text, subtasks, answer), stage, kind, options) in enumerate(rows):
        questions.append(Question(id=f"{split}-{i:05d}", question=text, answer=answer,
                                  stage=stage, kind=kind, split=split, subtasks=subtasks,
                                  options=options))
    return questions
