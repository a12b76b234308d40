"""The agent protocol: exact text of contexts and turns, and a strict parser for turns.

Grammar (markers from ``mgrpo.protocol_tokens``)::

    planner context  := "<|agents|>" CARDS "<|question|>" QUESTION "<|planner|>" (TURN RET?)*
    CARDS            := NAME ": " DESCRIPTION ("; " NAME ": " DESCRIPTION)*
    planner turn     := "<call>" AGENT "|" TASK "</call>" | "<answer>" ANSWER "</answer>"
    RET              := "<ret>" RESULT "</ret>"                    (appended by the runner)
    sub-agent context:= ("<|agents|>" CARDS)? "<|task|>" TASK "<|" ROLE "|>" (TURN (OBS|RET)?)*
    sub-agent turn   := "<tool>" PAYLOAD "</tool>" | "<return>" RESULT "</return>"
                        | "<call>" AGENT "|" TASK "</call>"      (a sub-agent that delegates)
    OBS              := "<obs>" OBSERVATION "</obs>"               (appended by the runner)

A sub-agent that delegates (the run config's ``agents: {role: {model: ..., calls: [...]}}``)
sees the cards of the sub-agents it may call before its task, and may call them as the
planner does (``<call>``, answered by ``<ret>``) before it returns.

A *turn* is the text generated for one step: exactly one tagged element, optionally followed
by ``<|end|>``, with surrounding whitespace tolerated. AGENT is ``[a-z][a-z0-9_]*``; TASK,
ANSWER, PAYLOAD and RESULT are non-blank and contain no protocol marker. Anything else is an
``invalid`` action with an ``error`` that says why: the parser never raises.

Text that enters a context from outside (questions, tool output, sub-agent results) has its
protocol markers removed by :func:`strip_markers`, so a tool cannot forge a turn.

What this module does not do: run episodes or decide rewards (``mgrpo.envs.rewards``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mgrpo import protocol_tokens as P

_LITERAL_MARKERS = (P.AGENTS, P.QUESTION, P.TASK, P.EOS, P.PAD, P.CALL_OPEN, P.CALL_CLOSE,
                    P.ANSWER_OPEN, P.ANSWER_CLOSE, P.TOOL_OPEN, P.TOOL_CLOSE, P.RETURN_OPEN,
                    P.RETURN_CLOSE, P.RET_OPEN, P.RET_CLOSE, P.OBS_OPEN, P.OBS_CLOSE)
_MARKER_RE = re.compile("|".join(re.escape(m) for m in _LITERAL_MARKERS)
                        + r"|<\|[A-Za-z0-9_]+\|>")
_AGENT_RE = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class AgentCard:
    """How the planner sees a sub-agent: its role name and a one-line description."""

    name: str
    description: str


DEFAULT_AGENTS = (AgentCard("searcher", "look up facts"), AgentCard("coder", "run python"))


@dataclass(frozen=True)
class PlannerAction:
    kind: Literal["call", "answer", "invalid"]
    agent: str | None = None
    task: str | None = None
    answer: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class SubagentAction:
    kind: Literal["tool", "return", "call", "invalid"]
    payload: str | None = None  # the tool input, the result, or (call) the task
    error: str | None = None
    agent: str | None = None  # call: the sub-agent called


def strip_markers(text: str) -> str:
    """``text`` with every protocol marker removed (observations cannot forge turns)."""
    return _MARKER_RE.sub("", text)


def planner_header(question: str, agents: Sequence[AgentCard] = DEFAULT_AGENTS) -> str:
    """``<|agents|>searcher: look up facts; coder: run python<|question|>...<|planner|>``."""
    cards = "; ".join(f"{a.name}: {a.description}" for a in agents)
    return f"{P.AGENTS}{strip_markers(cards)}{P.QUESTION}{strip_markers(question)}{P.PLANNER}"


def subagent_header(role: str, task: str) -> str:
    """``<|task|>{task}<|{role}|>``."""
    if not _AGENT_RE.fullmatch(role):
        raise ValueError(f"role {role!r} must match [a-z][a-z0-9_]* (it becomes a token "
                         f"<|{role}|>); rename the sub-agent")
    return f"{P.TASK}{strip_markers(task)}{P.ROLE_TOKEN.format(role=role)}"


def delegate_header(role: str, task: str, agents: Sequence[AgentCard]) -> str:
    """A delegating sub-agent's context: ``<|agents|>{cards}<|task|>{task}<|{role}|>``."""
    cards = "; ".join(f"{a.name}: {a.description}" for a in agents)
    return f"{P.AGENTS}{strip_markers(cards)}{subagent_header(role, task)}"


def render_ret(result: str) -> str:
    """A sub-agent's result as the planner sees it: ``<ret>{result}</ret>``."""
    return f"{P.RET_OPEN}{strip_markers(str(result))}{P.RET_CLOSE}"


def render_obs(observation: str) -> str:
    """A tool's output as the sub-agent sees it: ``<obs>{observation}</obs>``."""
    return f"{P.OBS_OPEN}{strip_markers(str(observation))}{P.OBS_CLOSE}"


def render_call(agent: str, task: str) -> str:
    return f"{P.CALL_OPEN}{agent}{P.CALL_SEP}{task}{P.CALL_CLOSE}"


def render_answer(answer: str) -> str:
    return f"{P.ANSWER_OPEN}{answer}{P.ANSWER_CLOSE}"


def render_tool(payload: str) -> str:
    return f"{P.TOOL_OPEN}{payload}{P.TOOL_CLOSE}"


def render_return(result: str) -> str:
    return f"{P.RETURN_OPEN}{result}{P.RETURN_CLOSE}"


def _element(text: object, tags: Sequence[tuple[str, str]]) -> tuple[str, str] | str:
    """``(open_tag, inner)`` if ``text`` is exactly one element with one of ``tags``, else
    the reason it is not."""
    if not isinstance(text, str):
        return f"turn is {type(text).__name__}, not text"
    body = text.strip()
    if body.endswith(P.EOS):
        body = body[: -len(P.EOS)].rstrip()
    for open_tag, close_tag in tags:
        if body.startswith(open_tag) and body.endswith(close_tag) and \
                len(body) >= len(open_tag) + len(close_tag):
            inner = body[len(open_tag): len(body) - len(close_tag)]
            marker = _MARKER_RE.search(inner)
            if marker:
                return f"{open_tag} element contains the marker {marker.group()!r}"
            if not inner.strip():
                return f"{open_tag} element is empty"
            return open_tag, inner.strip()
    shapes = " or ".join(f"{o}...{c}" for o, c in tags)
    return f"turn must be exactly {shapes} (optionally + {P.EOS}); got {text[:80]!r}"


def parse_planner_turn(text: str, agents: Sequence[str] | None = None) -> PlannerAction:
    """One planner turn -> call / answer / invalid. ``agents``: if given, the callable roles."""
    found = _element(text, ((P.CALL_OPEN, P.CALL_CLOSE), (P.ANSWER_OPEN, P.ANSWER_CLOSE)))
    if isinstance(found, str):
        return PlannerAction("invalid", error=found)
    tag, inner = found
    if tag == P.ANSWER_OPEN:
        return PlannerAction("answer", answer=inner)
    agent, sep, task = inner.partition(P.CALL_SEP)
    agent, task = agent.strip(), task.strip()
    if not sep or not _AGENT_RE.fullmatch(agent) or not task:
        return PlannerAction("invalid", error=f"call must be <call>agent|task</call> with agent "
                             f"[a-z][a-z0-9_]* and a non-empty task; got {inner[:80]!r}")
    if agents is not None and agent not in agents:
        return PlannerAction("invalid", agent=agent, task=task,
                             error=f"unknown agent {agent!r}; callable: {sorted(agents)}")
    return PlannerAction("call", agent=agent, task=task)


def parse_subagent_turn(text: str, callees: Sequence[str] = ()) -> SubagentAction:
    """One sub-agent turn -> tool / return / invalid; with ``callees`` (the sub-agents it
    may call) also call, of one of them."""
    tags = ((P.TOOL_OPEN, P.TOOL_CLOSE), (P.RETURN_OPEN, P.RETURN_CLOSE))
    found = _element(text, (*tags, (P.CALL_OPEN, P.CALL_CLOSE)) if callees else tags)
    if isinstance(found, str):
        return SubagentAction("invalid", error=found)
    tag, inner = found
    if tag == P.CALL_OPEN:
        call = parse_planner_turn(text, callees)
        if call.kind != "call":
            return SubagentAction("invalid", error=call.error, agent=call.agent)
        return SubagentAction("call", payload=call.task, agent=call.agent)
    return SubagentAction("tool" if tag == P.TOOL_OPEN else "return", payload=inner)


def _trajectory_ok(kinds: list[str], final: str, max_turns: int) -> bool:
    return (0 < len(kinds) <= max_turns and kinds[-1] == final
            and all(k not in ("invalid", final) for k in kinds[:-1]))


def planner_format_ok(actions: Sequence[PlannerAction], *, max_turns: int) -> bool:
    """r_format of a planner trajectory: every turn parsed, exactly one answer, at the end,
    within ``max_turns`` turns. ``max_turns`` has no default on purpose: callers pass the run
    config's ``sampling.planner_max_turns`` (the runner's own limit), one source of truth."""
    return _trajectory_ok([a.kind for a in actions], "answer", max_turns)


def subagent_format_ok(actions: Sequence[SubagentAction], *, max_turns: int) -> bool:
    """r_format of one sub-agent invocation: turns parsed, ends with its one return, within
    ``max_turns`` turns (the run config's ``sampling.subagent_max_turns``, passed by the
    caller)."""
    return _trajectory_ok([a.kind for a in actions], "return", max_turns)
