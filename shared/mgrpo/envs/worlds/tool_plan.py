"""The tool + plan team of AT-GRPO's games and planning worlds, shared by ``plan_path`` and
``sudoku4``: each team turn the ``tool`` role writes Python that runs in the sandbox (its
output is shown to the planner), then the ``plan`` role answers.

Actions use the agent protocol's markers (one special token each in our tokenizers, so a
turn's generation stops at the closing one): the tool role writes ``<tool>code</tool>``, the
plan role ``<answer>...</answer>``. Anything else is a malformed action: a turn with local
reward 0, ``malformed`` set and a feedback line, never an exception. Code that fails, times
out or prints nothing earns the tool role 0.

A world may define a :meth:`ToolPlanWorld.preamble`: code run before the tool role's
program in the same interpreter (``plan_path``'s ``grid_input``), noted in the tool's
observation by :meth:`ToolPlanWorld.tool_note`.

Local rewards (each in [0, 1]): tool -> 1.0 when its output, read as an answer, solves the
task; 0.2 when it ran and printed something; else 0. plan -> 1.0 when its answer solves the
task; otherwise the world's partial credit (at most 0.5) for a well-formed answer; 0 for a
malformed one. The team reward (:meth:`score`) is 1.0 once the plan role's answer solved
the task. The episode ends when solved or after ``max_turns`` team turns.

Splits are disjoint by construction: a task's canonical key is hashed (CRC-32) to one of 20
buckets: 14 train, 2 dev, 4 test. The generator draws candidates from a
``random.Random`` seeded by (world, split, seed) and keeps those in the split's buckets that
were not kept before, so the same seed gives the same tasks and no task is in two splits.

What this module does not do: define a task, its answer check or its expert (each world).
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable
from typing import Any

from mgrpo import protocol_tokens as T
from mgrpo.envs.worlds.base import SPLITS, Malformed, Turn, WorldState, WorldTask
from mgrpo.sandbox.local import LocalSandbox
from mgrpo.sandbox.types import ExecRequest

_BUCKETS = {"train": range(0, 14), "dev": range(14, 16), "test": range(16, 20)}
MAX_ACTION_CHARS = 4000  # longer actions are cut before anything reads them
FEEDBACK_CHARS = 160


def split_of(key: str) -> str:
    """The split of a task with canonical ``key`` (stable across runs and hosts)."""
    bucket = zlib.crc32(key.encode()) % 20
    return next(s for s, r in _BUCKETS.items() if bucket in r)


def seeded_tasks(world: str, split: str, n: int, seed: int,
                 draw: Callable[[random.Random], tuple[str, Any]]) -> list[Any]:
    """``n`` distinct tasks of ``split``; ``draw(rng)`` returns ``(key, task)``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    rng = random.Random(f"{world}/{split}/{seed}")
    kept: dict[str, Any] = {}
    for _ in range(2000 * max(n, 1)):
        if len(kept) >= n:
            return list(kept.values())
        key, task = draw(rng)
        if key not in kept and split_of(key) == split:
            kept[key] = task
    raise ValueError(f"{world}: only {len(kept)} distinct {split} tasks exist; ask for "
                     f"fewer than {n}")


def tagged(text: str, open_tag: str, close_tag: str) -> str | None:
    """The inside of the first ``open_tag ... close_tag`` of ``text`` (the closing marker
    may be missing at the very end, where generation stopped), stripped; None if absent."""
    text = text[:MAX_ACTION_CHARS]
    start = text.find(open_tag)
    if start < 0:
        return None
    body = text[start + len(open_tag):]
    end = body.find(close_tag)
    return (body if end < 0 else body[:end]).strip()


def clip(text: str, cap: int = FEEDBACK_CHARS) -> str:
    text = " ".join(text.split()) if "\n" not in text.strip() else text.strip()
    return text if len(text) <= cap else text[: cap - 3] + "..."


class ToolPlanWorld:
    """A tool + plan world; a subclass sets ``name`` and implements :meth:`draw`,
    :meth:`check` (an answer text -> (local reward, solved, feedback)), :meth:`expert_code`
    and :meth:`expert_answer`."""

    name = "tool_plan"
    roles = ("tool", "plan")
    stops = {"tool": (T.TOOL_CLOSE,), "plan": (T.ANSWER_CLOSE,)}  # where a turn ends
    answer_help = "the answer"

    def __init__(self, max_turns: int = 2, sandbox: Any = None, timeout_s: float = 2.0):
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        self.max_turns, self.timeout_s = max_turns, timeout_s
        self._sandbox = sandbox

    # -- what a subclass defines ------------------------------------------------------------
    def draw(self, rng: random.Random) -> tuple[str, WorldTask]:
        raise NotImplementedError

    def check(self, task: WorldTask, answer: str) -> tuple[float, bool, str]:
        raise NotImplementedError

    def expert_code(self, task: WorldTask) -> str:
        raise NotImplementedError

    def expert_answer(self, task: WorldTask) -> str:
        raise NotImplementedError

    def preamble(self, task: WorldTask) -> str:
        """Code the world runs before the tool role's program, in the same interpreter
        (default: none)."""
        return ""

    def tool_note(self) -> str:
        """A line the tool role's observation adds about :meth:`preamble` (default: none)."""
        return ""

    # -- the World protocol -----------------------------------------------------------------
    @property
    def sandbox(self) -> Any:
        if self._sandbox is None:  # the in-process jail, made on first use

            self._sandbox = LocalSandbox()
        return self._sandbox

    def tasks(self, split: str, n: int, seed: int) -> list[WorldTask]:
        found = seeded_tasks(self.name, split, n, seed, self.draw)
        return [WorldTask(f"{self.name}-{split}-{seed}-{i}", split, t.statement, t.solution,
                          t.data) for i, t in enumerate(found)]

    def reset(self, task: WorldTask) -> WorldState:
        return WorldState(task=task, data={"team_turn": 0, "tool_output": "", "answer": "",
                                           "feedback": "", "solved": False})

    def observe(self, state: WorldState, role: str) -> str:
        d = state.data
        lines = [state.task.statement]
        if role == "tool":
            lines.append("You are the tool agent: write Python that prints "
                         f"{self.answer_help}, as <tool>code</tool>.")
            if self.tool_note():
                lines.append(self.tool_note())
            if d["tool_output"]:
                lines.append(f"Your last output: {d['tool_output']}")
        else:
            lines.append(f"Tool output: {d['tool_output'] or '(none)'}")
            if d["answer"]:
                lines.append(f"Your last answer: {d['answer']} ({d['feedback']})")
            lines.append(f"You are the plan agent: give {self.answer_help} as "
                         "<answer>...</answer>.")
        return "\n".join(lines) + "\n"

    def act(self, state: WorldState, role: str, action: str) -> Turn:
        if role not in self.roles:
            raise ValueError(f"{self.name}: unknown role {role!r}; roles: {self.roles}")
        observation = self.observe(state, role)
        if role == "tool":
            reward, feedback = self._tool(state, action)
        else:
            reward, feedback = self._plan(state, action)
        turn = Turn(state.team_turn, role, observation, action, reward, str(feedback),
                    malformed=isinstance(feedback, Malformed))
        state.turns.append(turn)
        if role == self.roles[-1]:
            state.data["team_turn"] = state.team_turn + 1
        state.done = state.data["solved"] or state.team_turn >= self.max_turns
        return turn

    def score(self, state: WorldState) -> float:
        return 1.0 if state.data.get("solved") else 0.0

    def expert_action(self, state: WorldState, role: str) -> str:
        if role == "tool":
            return f"{T.TOOL_OPEN}{self.expert_code(state.task)}{T.TOOL_CLOSE}"
        shown = state.data.get("tool_output", "")
        if shown and self.check(state.task, shown)[1]:
            return f"{T.ANSWER_OPEN}{shown}{T.ANSWER_CLOSE}"
        return f"{T.ANSWER_OPEN}{self.expert_answer(state.task)}{T.ANSWER_CLOSE}"

    # -- the two roles ----------------------------------------------------------------------
    def _tool(self, state: WorldState, action: str) -> tuple[float, str]:
        code = tagged(action, T.TOOL_OPEN, T.TOOL_CLOSE)
        if not code:
            state.data["tool_output"] = ""
            return 0.0, Malformed("malformed: expected <tool>code</tool>")
        try:
            result = self.sandbox.execute(ExecRequest(code=self.preamble(state.task) + code,
                                                      timeout_s=self.timeout_s, memory_mb=256))
        except ValueError as error:  # a request the sandbox refuses (a lone surrogate)
            state.data["tool_output"] = ""
            return 0.0, clip(f"refused: {error}")
        out = result.stdout.strip()
        if result.status != "ok":
            errors = [ln for ln in result.stderr.splitlines() if ln.strip()]
            state.data["tool_output"] = clip(f"error: {errors[-1] if errors else result.status}")
            return 0.0, state.data["tool_output"]
        state.data["tool_output"] = clip(out)
        if not out:
            return 0.0, "printed nothing"
        return (1.0 if self.check(state.task, out)[1] else 0.2), "ran"

    def _plan(self, state: WorldState, action: str) -> tuple[float, str]:
        answer = tagged(action, T.ANSWER_OPEN, T.ANSWER_CLOSE)
        if answer is None:
            state.data.update(answer="", feedback="")
            return 0.0, Malformed("malformed: expected <answer>...</answer>")
        reward, solved, feedback = self.check(state.task, answer)
        state.data.update(answer=clip(answer, 40), feedback=feedback, solved=solved)
        return (1.0 if solved else min(reward, 0.5)), feedback


def digits(text: str) -> str:
    return re.sub(r"\s+", "", text)
