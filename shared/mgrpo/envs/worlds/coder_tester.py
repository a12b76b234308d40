"""``coder_tester``: a ``tester`` writes unit tests, a ``coder`` writes and revises a small
Python function (tasks: :mod:`mgrpo.envs.worlds.coder_tasks`); hidden tests decide.

A team turn: the tester answers with ``assert`` statements that call the function (top level
or directly inside ``def test_...():``; at most 20 are read); then the coder answers with
the function. Both write code, so both use the agent protocol's ``<tool>...</tool>``
(a fenced block or the bare code are read too). The coder's code runs in the sandbox
against the tester's tests and the hidden tests in one call, each test under its own time
limit, so a function that loops forever fails its tests instead of hanging the episode. The
episode ends when the hidden tests all pass or after ``max_turns``.

Rewards, each in [0, 1]:
- team: the fraction of the hidden tests the coder's latest code passes (1.0 all; 0.0 before
  any code).
- ``tester``: the fraction of its tests that hold for the reference solution and fail for
  a function that returns None (so ``assert f(1) == f(1)`` earns nothing); 0.0 if none could
  be read.
- ``coder``: the fraction of the tester's current tests its code passes; 0.2 if it defines
  the function and the tester gave no tests; 0.0 if the code fails before defining it.

Malformed turns (``Turn.malformed``): a tester's reply with no test that can be read, a
coder's reply with no code.

The coder sees the tester's tests and how its code did on them, never the hidden tests; the
tester sees the coder's code and its results, never the reference.

The scripted expert: the tester writes 4 correct tests (inputs other than the hidden ones),
the coder writes the reference solution.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from mgrpo import protocol_tokens as T
from mgrpo.envs.worlds.base import Malformed, WorldState, WorldTask, register_world
from mgrpo.envs.worlds.coder_tasks import assert_text, draw_task
from mgrpo.envs.worlds.kit import (
    KitWorld,
    clip,
    code_of,
    run_harness,
)

MAX_TESTS = 20

_HARNESS = '''\
import contextlib, io, json, signal


def _expire(signum, frame):
    raise TimeoutError("took longer than %g s" % LIMIT)


signal.signal(signal.SIGALRM, _expire)
_report = {"defined": False, "error": "", "results": []}
_ns = {"__name__": "solution"}
try:
    signal.setitimer(signal.ITIMER_REAL, LIMIT)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(CODE, "<code>", "exec"), _ns)
    signal.setitimer(signal.ITIMER_REAL, 0)
    _report["defined"] = callable(_ns.get(NAME))
    if not _report["defined"]:
        _report["error"] = "no function " + NAME + " is defined"
except BaseException as _e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    _report["error"] = (type(_e).__name__ + ": " + str(_e))[:200]
for _test in TESTS if _report["defined"] else []:
    try:
        signal.setitimer(signal.ITIMER_REAL, LIMIT)
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(_test, "<test>", "exec"), dict(_ns))
        signal.setitimer(signal.ITIMER_REAL, 0)
        _report["results"].append("")
    except AssertionError:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _report["results"].append("assertion failed")
    except BaseException as _e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _report["results"].append((type(_e).__name__ + ": " + str(_e))[:200])
print(MARKER, json.dumps(_report))
'''


def harness(code: str, name: str, tests: list[str], limit_s: float, marker: str) -> str:
    """The program that runs ``code`` then each of ``tests`` and prints its report."""
    values = {"LIMIT": repr(limit_s), "CODE": repr(code), "NAME": repr(name),
              "TESTS": repr(tests), "MARKER": repr(marker)}
    # one pass, so the inserted code is never searched for placeholders itself
    return re.sub(r"\b(LIMIT|CODE|NAME|TESTS|MARKER)\b", lambda m: values[m[1]], _HARNESS)


def read_tests(text: str, name: str) -> tuple[list[str], str]:
    """The ``assert`` statements of ``text`` that call ``name`` (top level or directly in a
    ``def test_...``), at most :data:`MAX_TESTS`, and a one-line note when none are read."""
    code = code_of(text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return [], f"could not parse the tests ({type(exc).__name__}); write assert lines"
    nodes = []
    for node in tree.body:
        if isinstance(node, ast.Assert):
            nodes.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            nodes.extend(n for n in node.body if isinstance(n, ast.Assert))
    tests = []
    for node in nodes:
        calls = any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))
        source = ast.get_source_segment(code, node) if calls else None
        if source:
            tests.append(source)
    if not tests:
        return [], f"no tests read: write assert statements that call {name}, e.g. " \
            f"assert {name}(...) == ..."
    return tests[:MAX_TESTS], ""


@register_world("coder_tester")
class CoderTesterWorld(KitWorld):
    name = "coder_tester"
    roles = ("tester", "coder")
    stops = {"tester": (T.TOOL_CLOSE,), "coder": (T.TOOL_CLOSE,)}  # where a turn ends

    draw = staticmethod(draw_task)

    def __init__(self, sandbox: Any = None, max_turns: int = 3, timeout_s: float = 3.0):
        super().__init__(sandbox, max_turns, timeout_s)

    def reset(self, task: WorldTask) -> WorldState:
        return WorldState(task=task, data={"team_turn": 0, "tests": [], "code": "",
                                           "code_report": "", "hidden_pass": 0.0})

    def observe(self, state: WorldState, role: str) -> str:
        self._check_role(role)
        name = state.task.data["function"]
        data = state.data
        parts = [state.task.statement, f"Team turn {state.team_turn + 1} of {self.max_turns}."]
        tests = "\n".join(data["tests"]) or "(none yet)"
        code = data["code"] or "(none yet)"
        if role == "tester":
            parts += [f"The coder's latest code:\n{clip(code, 1500)}",
                      f"How it did on your tests: {data['code_report'] or '(not run yet)'}",
                      "You are the tester. Write unit tests as assert statements that call "
                      f"{name}, one per line, as <tool>assert {name}(...) == ...</tool>."]
        else:
            parts += [f"The tester's tests:\n{tests}", f"Your latest code:\n{clip(code, 1500)}",
                      f"How it did on the tests: {data['code_report'] or '(not run yet)'}",
                      f"You are the coder. Write the function {name} as <tool>code</tool>."]
        return "\n\n".join(parts)

    def play(self, state: WorldState, role: str, action: str) -> tuple[float, str]:
        if role == "tester":
            return self._tester(state, action)
        return self._coder(state, action)

    def solved(self, state: WorldState) -> bool:
        return state.data["hidden_pass"] == 1.0

    def _run(self, code: str, tests: list[str], name: str) -> tuple[dict | None, str]:
        limit = round(max(0.05, self.timeout_s / (len(tests) + 4)), 3)
        return run_harness(self.sandbox, lambda m: harness(code, name, tests, limit, m),
                           self.timeout_s)

    def _tester(self, state: WorldState, action: str) -> tuple[float, str]:
        name = state.task.data["function"]
        tests, note = read_tests(action, name)
        state.data["tests"] = tests
        if not tests:
            return 0.0, Malformed(note)
        # each test against the reference, then against a function returning None (rebound
        # in that test's own copy of the namespace): one sandbox call
        null = f"def {name}(*args, **kwargs):\n    return None\n"
        report, error = self._run(state.task.solution["reference"],
                                  tests + [null + t for t in tests], name)
        if report is None:  # the reference always runs: the tests themselves hung or broke
            return 0.0, f"the tests could not run: {error}"
        results = report["results"]
        useful = sum(1 for ref, void in zip(results[:len(tests)], results[len(tests):],
                                            strict=True) if ref == "" and void != "")
        return round(useful / len(tests), 4), f"read {len(tests)} tests"

    def _coder(self, state: WorldState, action: str) -> tuple[float, str]:
        name = state.task.data["function"]
        code = code_of(action)
        state.data["code"] = code
        tests = state.data["tests"]
        hidden = [assert_text(name, t["args"], t["expected"])
                  for t in state.task.solution["hidden_tests"]]
        report, error = self._run(code, tests + hidden, name) if code else (None, "no code")
        if report is None or not report["defined"]:
            reason = error if report is None else report["error"]
            state.data.update(hidden_pass=0.0, code_report=f"the code failed: {reason}")
            report_line = state.data["code_report"]
            return 0.0, report_line if code else Malformed(report_line)
        results = report["results"]
        mine, hidden_results = results[:len(tests)], results[len(tests):]
        state.data["hidden_pass"] = round(
            sum(1 for r in hidden_results if r == "") / len(hidden), 4)
        if not tests:
            state.data["code_report"] = "defines the function; the tester gave no tests"
            return 0.2, state.data["code_report"]
        passed = sum(1 for r in mine if r == "")
        failed = [f"{t} -> {r}" for t, r in zip(tests, mine, strict=True) if r][:3]
        state.data["code_report"] = f"passes {passed} of {len(tests)} tests" + \
            ("; failed: " + "; ".join(clip(f, 200) for f in failed) if failed else "")
        return round(passed / len(tests), 4), state.data["code_report"]

    def score(self, state: WorldState) -> float:
        return float(state.data["hidden_pass"])

    def expert_action(self, state: WorldState, role: str) -> str:
        self._check_role(role)
        if role == "coder":
            return f"{T.TOOL_OPEN}{state.task.solution['reference']}{T.TOOL_CLOSE}"
        name = state.task.data["function"]
        tests = "\n".join(assert_text(name, t["args"], t["expected"])
                          for t in state.task.data["expert_tests"])
        return f"{T.TOOL_OPEN}{tests}{T.TOOL_CLOSE}"
