"""Pieces the built-in worlds share: seeded, disjoint splits; reading a tagged part of a
model's text; running model-written code in the sandbox and reading back a harness's report.

Splits are disjoint by construction: a task's canonical key is hashed (SHA-256, not Python's
salted ``hash``) to one of 20 buckets; 16 are ``train``, 2 ``dev``, 2 ``test``. A generator
draws candidates from ``random.Random(f"{world}/{split}/{seed}")`` and keeps those whose key
falls in the split's buckets and was not kept before, so the same seed gives the same tasks
and no task appears in two splits whatever the seeds.

Sandboxed code: :func:`run_code` never raises for what the code does. Code the sandbox
refuses (a lone surrogate, too long), a timeout, a memory or output limit each come back as a
:class:`CodeRun` with ``ok=False`` and a one-line ``error``. A harness that must report
numbers (tests passed) prints one line ``<marker> <json>`` last; the marker is fresh per call
and :func:`run_harness` reads only that line, so a model's ``print`` cannot pass for the
harness's report by accident. (Code that searches the interpreter's memory can find the
marker: the sandbox bounds what model code can do to the host, not what it can claim.)

What this module does not do: define tasks or rewards (each world does).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from mgrpo.envs.worlds.base import Malformed, Turn, WorldState, WorldTask
from mgrpo.sandbox.local import LocalSandbox
from mgrpo.sandbox.types import ExecRequest
from mgrpo.tools.python import Executor, refusal_of

_BUCKETS = {"train": range(0, 16), "dev": range(16, 18), "test": range(18, 20)}
MAX_ACTION_CHARS = 20_000  # longer actions are cut before anything reads them


def split_of(key: str) -> str:
    """The split a task with canonical ``key`` belongs to (stable across runs and hosts)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 20
    return next(s for s, r in _BUCKETS.items() if bucket in r)


def seeded_tasks(world: str, split: str, n: int, seed: int,
                 draw: Callable[[random.Random], tuple[str, Callable[[], Any]] | None],
                 max_tries_per_task: int = 400) -> list[tuple[str, Any]]:
    """``n`` distinct ``(task_id, task)`` of ``split``. ``draw(rng)`` returns ``(key, make)``
    or None; ``make()`` (called only for a new key of this split, so costly checks such as a
    solver run only there) returns the task or None. The id is ``{world}-{split}-`` and 10
    hex digits of the key's hash."""
    if split not in _BUCKETS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(_BUCKETS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{world}/{split}/{seed}")
    kept: dict[str, Any] = {}
    tries = 0
    while len(kept) < n:
        tries += 1
        if tries > max_tries_per_task * max(n, 1):
            raise ValueError(f"{world}: only {len(kept)} distinct {split} tasks found after "
                             f"{tries - 1} draws; ask for fewer than {n}")
        made = draw(rng)
        if made is None:
            continue
        key, make = made
        if key in kept or split_of(key) != split:
            continue
        task = make()
        if task is not None:
            kept[key] = task
    return [(f"{world}-{split}-{hashlib.sha256(k.encode()).hexdigest()[:10]}", t)
            for k, t in kept.items()]


def tagged(text: str, tag: str) -> str | None:
    """The inside of the last ``<tag>...</tag>`` in ``text``, stripped; when no pair is
    complete, what follows the last ``<tag>`` (generation stops at the closing marker, which
    may be left out); None if ``<tag>`` is absent."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL | re.IGNORECASE)
    if found:
        return found[-1].strip()
    start = text.lower().rfind(f"<{tag}>")
    return text[start + len(tag) + 2:].strip() if start >= 0 else None


def code_of(text: str) -> str:
    """The code in a model's action: inside ``<tool>...</tool>`` (the agent protocol's
    marker) or ``<code>...</code>`` if present, then the last fenced block (```python ...```)
    in that, else the whole of it."""
    for tag in ("tool", "code"):
        inside = tagged(text, tag)
        if inside is not None:
            text = inside
            break
    fenced = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, flags=re.DOTALL)
    return fenced[-1].strip("\n") if fenced else text.strip()


def clip(text: str, cap: int = 400) -> str:
    """``text`` cut to ``cap`` characters for a feedback line."""
    return text if len(text) <= cap else text[: cap - 3] + "..."


@dataclass(frozen=True)
class CodeRun:
    ok: bool  # ran to the end with exit code 0
    output: str  # stdout, stripped and clipped
    error: str  # one line when not ok


def default_executor() -> Executor:
    """The in-process jail (:class:`mgrpo.sandbox.local.LocalSandbox`)."""
    return LocalSandbox()


def run_code(executor: Executor, code: str, timeout_s: float, memory_mb: int = 256,
             cap: int = 400) -> CodeRun:
    """Run ``code`` in the sandbox; see the module docstring for what never raises."""
    try:
        request = ExecRequest(code=code, timeout_s=timeout_s, memory_mb=memory_mb)
    except ValidationError as error:
        return CodeRun(False, "", refusal_of(error))
    result = executor.execute(request)
    out = result.stdout.strip()
    if result.status == "ok":
        return CodeRun(True, clip(out, cap), "")
    if result.status == "timeout":
        return CodeRun(False, clip(out, cap), f"error: timeout after {timeout_s:g}s")
    if result.status == "memory":
        return CodeRun(False, clip(out, cap), "error: memory limit")
    if result.status == "output_limit":
        return CodeRun(False, clip(out, cap), "error: output limit")
    lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
    return CodeRun(False, clip(out, cap),
                   clip(lines[-1] if lines else f"error: exit code {result.exit_code}", 300))


def run_harness(executor: Executor, build: Callable[[str], str], timeout_s: float,
                memory_mb: int = 256) -> tuple[dict | None, str]:
    """Run the harness ``build(marker)`` and return ``(report, error)``: the JSON object it
    printed after ``marker`` on its last such line, or None and a one-line reason."""
    marker = "@@report-" + secrets.token_hex(8)
    try:
        request = ExecRequest(code=build(marker), timeout_s=timeout_s, memory_mb=memory_mb)
    except ValidationError as error:
        return None, refusal_of(error)
    result = executor.execute(request)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(marker + " "):
            try:
                report = json.loads(line[len(marker) + 1:])
            except json.JSONDecodeError:
                break
            if isinstance(report, dict):
                return report, ""
            break
    if result.status == "timeout":
        return None, f"error: timeout after {timeout_s:g}s"
    if result.status in ("memory", "output_limit"):
        return None, f"error: {result.status.replace('_', ' ')}"
    lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
    return None, clip(lines[-1] if lines else "error: the code ended before the tests ran", 300)


class KitWorld:
    """What the kit's worlds share: the sandbox made on first use, seeded tasks through
    :func:`seeded_tasks`, and one action's bookkeeping (:meth:`act`). A world sets ``name``,
    ``roles``, ``draw`` (``rng -> task`` with ``statement``, ``solution``, ``data``) and
    implements ``observe``, ``play`` (one role's action -> (local reward, feedback); a
    :class:`~mgrpo.envs.worlds.base.Malformed` feedback marks the turn malformed) and
    ``solved``."""

    name: str
    roles: tuple[str, ...]
    draw: Callable[[random.Random], Any]

    def __init__(self, sandbox: Any = None, max_turns: int = 3, timeout_s: float = 2.0):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self._sandbox = sandbox

    @property
    def sandbox(self):
        if self._sandbox is None:
            self._sandbox = default_executor()
        return self._sandbox

    def tasks(self, split: str, n: int, seed: int) -> list[WorldTask]:
        return [WorldTask(task_id=task_id, split=split, statement=t.statement,
                          solution=t.solution, data=t.data)
                for task_id, t in seeded_tasks(self.name, split, n, seed, type(self).draw)]

    def act(self, state: WorldState, role: str, action: str) -> Turn:
        """Apply ``role``'s action (cut at :data:`MAX_ACTION_CHARS`): its :class:`Turn`, the
        team turn advanced after the last role, ``state.done`` when solved or out of turns."""
        self._check_role(role)
        if state.done:
            raise ValueError("the episode is over; reset() a new one")
        observation = self.observe(state, role)
        action = action[:MAX_ACTION_CHARS]
        reward, feedback = self.play(state, role, action)
        turn = Turn(index=state.team_turn, role=role, observation=observation, action=action,
                    reward=reward, feedback=str(feedback),
                    malformed=isinstance(feedback, Malformed))
        state.turns.append(turn)
        if role == self.roles[-1]:
            state.data["team_turn"] = state.team_turn + 1
        if self.solved(state) or state.team_turn >= self.max_turns:
            state.done = True
        return turn

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise ValueError(f"unknown role {role!r} in world {self.name!r}; roles: "
                             f"{', '.join(self.roles)}")
