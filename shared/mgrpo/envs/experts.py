"""Scripted expert policies: solve a question through the protocol with the REAL tools.

The planner walks the question's gold decomposition, filling each subtask's template with what
its sub-agents actually returned; the searcher queries the task text and reads the matching
document from the observation; the coder prints the expression. With every error rate 0 this
solves every built-in question (tested on all splits). Errors, each drawn independently from
the seeded ``rng`` with its configured rate:

- ``planner.skip_delegation`` (per episode): answer at once with a plausible wrong guess (a
  number with as many digits, a one-letter variant of a name, the other option). This is the
  SYSTEMATIC error the demo relies on: RL must learn to delegate.
- ``planner.wrong_agent`` (per delegation): a look-up sent to the coder, arithmetic to the
  searcher.
- ``planner.arithmetic_slip`` (per coder subtask): compute in the head instead of calling the
  coder, off by 1-9 (a comparison comes out flipped), then answer.
- ``searcher.bad_query`` (per searcher call): query without the entity name.
- ``coder.code_slip`` (per coder call): the wrong operator (``+``/``-``, ``<``/``>`` swapped).

Transcripts are SFT data (``EpisodeTranscript.sft_records``): per agent invocation, headers
and observations as ``train: false`` segments, each generated turn one ``train: true``
segment ending with its stop marker.

What this module does not do: sample from models, or score beyond exact match.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

from mgrpo.envs import protocol as P
from mgrpo.envs.arith import evaluate_arithmetic
from mgrpo.envs.corpus import parse_document
from mgrpo.envs.kg import look_alike
from mgrpo.envs.questions import Question
from mgrpo.envs.rewards import exact_match, normalize_answer
from mgrpo.validation import StrictModel, nearest

UNKNOWN = "unknown"
_SWAPS = {" + ": " - ", " - ": " + ", " > ": " < ", " < ": " > "}
_OP_RE = re.compile(r" [-+<>] ")


class PlannerErrors(StrictModel):

    skip_delegation: float = Field(0.0, ge=0, le=1, description="per episode")
    wrong_agent: float = Field(0.0, ge=0, le=1, description="per delegation")
    arithmetic_slip: float = Field(0.0, ge=0, le=1, description="per coder subtask")


class SearcherErrors(StrictModel):

    bad_query: float = Field(0.0, ge=0, le=1, description="per search")


class CoderErrors(StrictModel):

    code_slip: float = Field(0.0, ge=0, le=1, description="per coder call")


class ExpertErrors(StrictModel):

    planner: PlannerErrors = Field(default_factory=PlannerErrors)
    searcher: SearcherErrors = Field(default_factory=SearcherErrors)
    coder: CoderErrors = Field(default_factory=CoderErrors)

    @classmethod
    def parse(cls, spec: str) -> ExpertErrors:
        """``"planner.skip_delegation=0.5,searcher.bad_query=0.1"`` -> ExpertErrors."""
        valid = {f"{agent}.{name}" for agent, model in
                 (("planner", PlannerErrors), ("searcher", SearcherErrors), ("coder", CoderErrors))
                 for name in model.model_fields}
        rates: dict[str, dict[str, float]] = {}
        for item in filter(None, (x.strip() for x in spec.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in valid:
                guess = nearest(key.strip(), sorted(valid))
                hint = f" (did you mean '{guess}'?)" if guess else ""
                raise ValueError(f"error rate {item!r} must be KEY=RATE with KEY one of "
                                 f"{sorted(valid)}{hint}")
            agent, name = key.strip().split(".")
            try:
                rates.setdefault(agent, {})[name] = float(value)
            except ValueError:
                raise ValueError(f"rate {value!r} of {key} is not a number in [0, 1]") from None
        return cls(**rates)


class Segment(BaseModel):
    text: str
    train: bool


class AgentTranscript(BaseModel):
    agent: str
    task: str | None = None  # sub-agents: the task given
    result: str | None = None  # sub-agents: returned text; planner: the final answer
    segments: list[Segment] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)  # injected error types, e.g. "bad_query"
    chances: dict[str, int] = Field(default_factory=dict)  # error type -> times drawn

    def add(self, text: str, train: bool) -> None:
        self.segments.append(Segment(text=text, train=train))

    def draw(self, error: str, rate: float, rng: random.Random) -> bool:
        """One Bernoulli(rate) draw for ``error``, counted as a chance (and an error if hit).
        The draw happens even at rate 0 so that the rng stream does not depend on rates."""
        self.chances[error] = self.chances.get(error, 0) + 1
        hit = rng.random() < rate
        if hit:
            self.errors.append(error)
        return hit

    def sft_record(self) -> dict:
        return {"agent": self.agent, "segments": [s.model_dump() for s in self.segments]}


class EpisodeTranscript(BaseModel):
    question_id: str
    answer: str
    correct: float
    planner: AgentTranscript
    subagents: list[AgentTranscript] = Field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """Every injected error as ``agent.type``, in episode order."""
        out = [f"planner.{e}" for e in self.planner.errors]
        return out + [f"{s.agent}.{e}" for s in self.subagents for e in s.errors]

    @property
    def chances(self) -> dict[str, int]:
        """How often each ``agent.type`` error was drawn (its realised rate's denominator)."""
        out: dict[str, int] = {}
        for t in [self.planner, *self.subagents]:
            for error, n in t.chances.items():
                out[f"{t.agent}.{error}"] = out.get(f"{t.agent}.{error}", 0) + n
        return out

    def sft_records(self) -> list[dict]:
        return [self.planner.sft_record()] + [s.sft_record() for s in self.subagents]


def _one_line(text: str) -> str:
    return " ".join(P.strip_markers(text).split()) or UNKNOWN


def plausible_guess(gold: str, rng: random.Random, options: Sequence[str] | None = None) -> str:
    """A wrong answer that looks right: the other option, a same-length number, or a
    one-letter variant of a name."""
    if options and len(options) == 2 and gold in options:
        return options[1 - options.index(gold)]
    if gold.isdigit():
        digits = len(gold)
        low, high = (10 ** (digits - 1) if digits > 1 else 0), 10**digits - 1
        guess = gold
        while guess == gold:
            guess = str(rng.randint(low, high))
        return guess
    if any(ch.islower() for ch in gold):
        return look_alike(gold, {gold}, rng)
    return gold + "x"


def head_arithmetic(task: str, rng: random.Random) -> str:
    """The planner's mental arithmetic: off by 1-9, or a flipped comparison."""
    try:
        value = evaluate_arithmetic(task)
    except ValueError:
        return str(rng.randint(1, 9999))
    if value in ("True", "False"):
        return "False" if value == "True" else "True"
    try:
        return str(int(value) + rng.choice((-1, 1)) * rng.randint(1, 9))
    except ValueError:  # a fraction: still wrong, still plausible
        return str(round(float(value) + rng.randint(1, 9), 6))


def _final_answer(question: Question, results: list[str]) -> str:
    last = results[-1] if results else UNKNOWN
    if question.options:
        return question.options[0] if normalize_answer(last) == "true" else question.options[1]
    return last


def _other_agent(agent: str, roles: Sequence[str]) -> str:
    others = [r for r in roles if r != agent]
    return others[0] if others else agent


def run_searcher(task: str, tool, errors: SearcherErrors, rng: random.Random) -> AgentTranscript:
    """Query with the task text (``population of Varnholt``), return the entity's value."""
    out = AgentTranscript(agent="searcher", task=task)
    out.add(P.subagent_header("searcher", task), False)
    attr, sep, entity = task.partition(" of ")
    query = task
    if out.draw("bad_query", errors.bad_query, rng):
        query = attr.strip() if sep and attr.strip() else "facts"
    observation = tool.run(query)
    out.add(P.render_tool(query), True)
    out.add(P.render_obs(observation), False)
    parsed = [parse_document(line) for line in observation.splitlines()]
    docs = [d for d in parsed if d is not None]
    exact = [facts for title, facts in docs if title == entity.strip() and attr in facts]
    any_attr = [facts for _, facts in docs if attr in facts]
    if exact:
        result = exact[0][attr]
    elif any_attr:  # the wrong document: a plausible, wrong value
        result = any_attr[0][attr]
    else:
        result = docs[0][0] if docs else UNKNOWN
    out.result = _one_line(result)
    out.add(P.render_return(out.result), True)
    return out


def run_coder(task: str, tool, errors: CoderErrors, rng: random.Random) -> AgentTranscript:
    """``print(<task>)`` through the python tool; return what it printed."""
    out = AgentTranscript(agent="coder", task=task)
    out.add(P.subagent_header("coder", task), False)
    expression = task
    if out.draw("code_slip", errors.code_slip, rng):
        match = _OP_RE.search(expression)
        if match:
            expression = (expression[: match.start()] + _SWAPS[match.group()]
                          + expression[match.end():])
    code = f"print({expression})"
    observation = tool.run(code)
    out.add(P.render_tool(code), True)
    out.add(P.render_obs(observation), False)
    out.result = _one_line(observation)
    out.add(P.render_return(out.result), True)
    return out


def run_expert_episode(question: Question, tools: Mapping[str, object],
                       errors: ExpertErrors | None = None, rng: random.Random | None = None,
                       agents: Sequence[P.AgentCard] = P.DEFAULT_AGENTS) -> EpisodeTranscript:
    """Solve ``question`` through the protocol with ``tools`` (role -> tool: ``searcher`` ->
    search, ``coder`` -> python), injecting ``errors`` with the seeded ``rng``."""
    errors = errors or ExpertErrors()
    rng = rng or random.Random(0)
    roles = [a.name for a in agents]
    planner = AgentTranscript(agent="planner")
    planner.add(P.planner_header(question.question, agents), False)
    subagents: list[AgentTranscript] = []
    results: list[str] = []
    answer = None
    if planner.draw("skip_delegation", errors.planner.skip_delegation, rng):
        answer = plausible_guess(question.answer, rng, question.options)
    for subtask in question.subtasks if answer is None else []:
        fill = {f"r{j}": r for j, r in enumerate(results)}
        task = subtask.template.format(**fill) if subtask.template else subtask.task
        if subtask.agent == "coder" and planner.draw("arithmetic_slip",
                                                     errors.planner.arithmetic_slip, rng):
            results.append(head_arithmetic(task, rng))
            break  # did the sum in its head: answer now
        agent = subtask.agent
        if planner.draw("wrong_agent", errors.planner.wrong_agent, rng):
            agent = _other_agent(agent, roles)
        planner.add(P.render_call(agent, task), True)
        run = run_coder if agent == "coder" else run_searcher
        sub_errors = errors.coder if agent == "coder" else errors.searcher
        sub = run(task, tools[agent], sub_errors, rng)
        subagents.append(sub)
        planner.add(P.render_ret(sub.result or UNKNOWN), False)
        results.append(sub.result or UNKNOWN)
    if answer is None:
        answer = _one_line(_final_answer(question, results))
    planner.result = answer
    planner.add(P.render_answer(answer), True)
    return EpisodeTranscript(question_id=question.id, answer=answer,
                             correct=exact_match(answer, question.answer),
                             planner=planner, subagents=subagents)
