"""``math_team``: a ``tool_user`` computes, a ``reasoner`` answers, on the benchmark's
arithmetic questions (the ``compare`` and ``arith`` kinds of :mod:`mgrpo.envs.questions`,
with their phrasings), the facts given in the statement instead of looked up.

Kinds, drawn evenly:
- ``compare``: "Which city has the larger population, A or B?"; gold expression ``X > Y``,
  the answer the name it picks;
- ``arith``: "How many more people live in A than in B?" (or combined, or years between);
  gold expression ``X - Y`` or ``X + Y``, the answer its value;
- ``founder_age``: "How old was the founder of C when C was founded?"; gold ``F - B``.

Names come from the benchmark's name pools and numbers from its ranges; a task's key is its
statement, so a question is in one split only.

A team turn: the tool user writes one arithmetic expression (``<tool>48213 - 31002</tool>``,
the agent protocol's marker; ``<expr>``, a fenced block or the bare expression are read
too) and :func:`mgrpo.envs.arith.evaluate_arithmetic` computes it (numbers,
``+ - * / // %``, one comparison, abs/min/max/round; anything else is refused with its
reason; no code runs). Then the reasoner, shown the expression and its value,
answers ``<answer>...</answer>``; that ends the episode. A reply without the tag is a
zero-reward malformed turn and the team goes on, up to ``max_turns``; so is an expression
the evaluator refuses.

Rewards, each in [0, 1]:
- team: 1.0 if the final answer matches the gold answer (case, surrounding spaces, a trailing
  period and thousands separators ignored), else 0.0;
- ``tool_user``: 0.0 if the expression is refused; 0.2 if it computes to another value; 0.5 if
  to the gold value without using the question's numbers; 1.0 if to the gold value using them;
- ``reasoner``: 1.0 for the right final answer, else 0.0.

The scripted expert writes the gold expression and the gold answer. ``sandbox`` is accepted
(and unused) so every world builds with the same options.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from mgrpo import protocol_tokens as T
from mgrpo.envs.arith import evaluate_arithmetic
from mgrpo.envs.kg import _name_pool
from mgrpo.envs.questions import ARITHS, COMPARES, FOUNDER_AGE
from mgrpo.envs.worlds.base import Malformed, WorldState, WorldTask, register_world
from mgrpo.envs.worlds.kit import KitWorld, clip, code_of, tagged

KINDS = ("compare", "arith", "founder_age")
_RANGES = {"population": (1000, 99999), "founded": (1100, 1900), "birth year": (1940, 1999),
           "employees": (10, 9999)}
_FACTS = {"population": "{e} has a population of {v}.", "founded": "{e} was founded in {v}.",
          "birth year": "{e} was born in {v}.", "employees": "{e} has {v} employees."}


@functools.cache
def _names(type_: str) -> tuple[str, ...]:
    return tuple(_name_pool(type_))  # type: ignore[arg-type]


def _pair(rng: random.Random, type_: str, attr: str) -> tuple[str, str, int, int]:
    a, b = rng.sample(_names(type_), 2)
    lo, hi = _RANGES[attr]
    return a, b, rng.randint(lo, hi), rng.randint(lo, hi)


def _draw(rng: random.Random):
    kind = rng.choice(KINDS)
    if kind == "founder_age":
        company = rng.choice(_names("company"))
        founder = rng.choice(_names("person"))
        born = rng.randint(1940, 1999)
        founded = born + rng.randint(20, min(60, 2024 - born))
        facts = (f"{company} was founded in {founded} by {founder}. "
                 f"{founder} was born in {born}.")
        question, expression = FOUNDER_AGE.format(e=company), f"{founded} - {born}"
        answer = evaluate_arithmetic(expression)
    elif kind == "compare":
        type_, attr, op, phrase = rng.choice(COMPARES)
        a, b, va, vb = _pair(rng, type_, attr)
        if va == vb:
            return None
        facts = " ".join(_FACTS[attr].format(e=e, v=v) for e, v in ((a, va), (b, vb)))
        question, expression = phrase.format(a=a, b=b), f"{va} {op} {vb}"
        answer = a if evaluate_arithmetic(expression) == "True" else b
    else:
        type_, attr, op, phrase = rng.choice(ARITHS)
        a, b, va, vb = _pair(rng, type_, attr)
        if op == "-" and va <= vb:
            if va == vb:
                return None
            a, b, va, vb = b, a, vb, va
        facts = " ".join(_FACTS[attr].format(e=e, v=v) for e, v in ((a, va), (b, vb)))
        question, expression = phrase.format(a=a, b=b), f"{va} {op} {vb}"
        answer = evaluate_arithmetic(expression)
    statement = f"{facts}\nQuestion: {question}"
    task = WorldTask(task_id="", split="", statement=statement, solution=answer,
                     data={"kind": kind, "expression": expression,
                           "value": evaluate_arithmetic(expression)})
    return statement, lambda: task


def normalize(answer: str) -> str:
    """The form answers are compared in: trimmed, lower case, no trailing period, no
    thousands separators, single spaces."""
    text = " ".join(answer.strip().rstrip(".").strip().split()).casefold()
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def expression_of(action: str) -> str:
    inside = tagged(action, "expr")
    return inside if inside is not None else code_of(action)


@register_world("math_team")
class MathTeamWorld(KitWorld):
    name = "math_team"
    roles = ("tool_user", "reasoner")
    stops = {"tool_user": (T.TOOL_CLOSE,), "reasoner": (T.ANSWER_CLOSE,)}  # where a turn ends

    draw = staticmethod(_draw)

    def __init__(self, sandbox: Any = None, max_turns: int = 2):
        super().__init__(None, max_turns)  # the safe evaluator is its tool: no sandbox

    def reset(self, task: WorldTask) -> WorldState:
        return WorldState(task=task, data={"team_turn": 0, "expression": "", "value": "",
                                           "answer": None})

    def observe(self, state: WorldState, role: str) -> str:
        self._check_role(role)
        parts = [state.task.statement, f"Team turn {state.team_turn + 1} of {self.max_turns}."]
        for turn in state.turns[-4:]:
            parts.append(f"[{turn.role}] {clip(turn.action, 300)}\n-> {turn.feedback}")
        if role == "tool_user":
            parts.append("You are the tool user. Write one arithmetic expression over the "
                         "numbers that the answer needs (+ - * / // %, one comparison, "
                         "abs/min/max/round), e.g. <tool>48213 - 31002</tool>.")
        else:
            shown = state.data["expression"] or "(none)"
            parts.append(f"Tool: {shown} = {state.data['value'] or '(no value)'}\nYou are the "
                         "reasoner. Give the final answer as <answer>...</answer> (a number, "
                         "or the name the question asks for).")
        return "\n\n".join(parts)

    def play(self, state: WorldState, role: str, action: str) -> tuple[float, str]:
        if role == "tool_user":
            return self._tool(state, action)
        return self._reason(state, action)

    def solved(self, state: WorldState) -> bool:
        return state.data["answer"] is not None

    def _tool(self, state: WorldState, action: str) -> tuple[float, str]:
        expression = expression_of(action)
        state.data.update(expression=clip(expression, 200), value="")
        try:
            value = evaluate_arithmetic(expression)
        except ValueError as exc:
            return 0.0, Malformed(f"refused: {clip(str(exc), 300)}")
        except (RecursionError, MemoryError):
            return 0.0, Malformed("refused: the expression is nested too deeply")
        state.data["value"] = value
        if value != state.task.data["value"]:
            return 0.2, f"= {value}"
        needed = re.findall(r"\d+", state.task.data["expression"])
        used = re.findall(r"\d+", expression)
        return (1.0 if all(n in used for n in needed) else 0.5), f"= {value}"

    def _reason(self, state: WorldState, action: str) -> tuple[float, str]:
        answer = tagged(action, "answer")
        if answer is None:
            return 0.0, Malformed("no final answer: give it as <answer>...</answer>")
        state.data["answer"] = clip(answer, 200)
        correct = normalize(answer) == normalize(state.task.solution)
        return (1.0, "correct") if correct else (0.0, "wrong")

    def score(self, state: WorldState) -> float:
        answer = state.data["answer"]
        return float(answer is not None and normalize(answer) == normalize(state.task.solution))

    def expert_action(self, state: WorldState, role: str) -> str:
        self._check_role(role)
        if role == "tool_user":
            return f"{T.TOOL_OPEN}{state.task.data['expression']}{T.TOOL_CLOSE}"
        return f"<answer>{state.task.solution}</answer>"
