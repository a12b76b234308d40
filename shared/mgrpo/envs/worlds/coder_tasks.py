"""The ``coder_tester`` world's tasks: small Python functions made from templates (arithmetic,
string and list operations), each with a reference solution and hidden unit tests.

A template has a function name and signature, a description and a reference body with
parameters (``{a}``, ``{k}`` ...) drawn per task, and an input drawer. The expected outputs
are computed by running the reference (our own template code, in this process) on drawn
inputs: 8 hidden tests, 4 more for the scripted tester, and one example in the statement.
A task's key is its template and parameters, so the same function is never in two splits.

What this module does not do: run model code (:mod:`mgrpo.envs.worlds.coder_tester` does,
in the sandbox).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgrpo.envs.worlds.base import WorldTask

Params = dict[str, Any]


_LETTERS = "abcdefghiklmnoprstuy"


def _ints(lo: int, hi: int) -> Callable[[random.Random], list]:
    return lambda rng: [rng.randint(lo, hi)]


def _word(rng: random.Random) -> list:
    return ["".join(rng.choice(_LETTERS) for _ in range(rng.randint(0, 9)))]


def _int_list(rng: random.Random) -> list:
    return [[rng.randint(-9, 20) for _ in range(rng.randint(0, 7))]]


@dataclass(frozen=True)
class Template:
    family: str  # arithmetic, string, list
    name: str
    signature: str  # "x: int" -> def name(x: int) -> returns
    returns: str
    description: str  # formatted with the parameters
    body: str  # the reference's body, formatted with the parameters (repr'd)
    params: Callable[[random.Random], Params]
    inputs: Callable[[random.Random], list]


def _clamp_params(rng: random.Random) -> Params:
    lo = rng.randint(-20, 10)
    return {"lo": lo, "hi": lo + rng.randint(1, 12)}


def _pair_params(rng: random.Random) -> Params:
    a, b = sorted(rng.sample(range(2, 10), 2))  # sorted: "a or b" is "b or a"
    return {"a": a, "b": b}


def _letter_pair(rng: random.Random) -> Params:
    c, d = sorted(rng.sample(_LETTERS, 2))
    return {"c": c, "d": d}


TEMPLATES: tuple[Template, ...] = (
    Template("arithmetic", "affine", "x: int", "int", "Return x * {a} + {b}.",
             "return x * {a} + {b}",
             lambda r: {"a": r.choice([i for i in range(-9, 10) if i not in (0, 1)]),
                        "b": r.randint(-25, 25)}, _ints(-30, 30)),
    Template("arithmetic", "clamp", "x: int", "int",
             "Return x limited to the range [{lo}, {hi}] (lo if below it, hi if above it).",
             "return max({lo}, min({hi}, x))", _clamp_params, _ints(-25, 25)),
    Template("arithmetic", "digit_sum_mod", "n: int", "int",
             "Return the sum of the decimal digits of abs(n), modulo {k}.",
             "return sum(int(d) for d in str(abs(n))) % {k}",
             lambda r: {"k": r.randint(2, 50)}, _ints(-99999, 99999)),
    Template("arithmetic", "divisible_by_either", "n: int", "bool",
             "Return True if n is divisible by {a} or by {b}, else False.",
             "return n % {a} == 0 or n % {b} == 0", _pair_params, _ints(-60, 60)),
    Template("string", "repeat_joined", "s: str", "str",
             "Return s repeated {k} times, joined by {sep!r}.",
             "return {sep!r}.join([s] * {k})",
             lambda r: {"k": r.randint(2, 6),
                        "sep": r.choice(["-", ", ", "|", " ", "+", ":", "/", "."])},
             _word),
    Template("string", "count_letters", "s: str", "int",
             "Return how many characters of s are {c!r} or {d!r}, ignoring case.",
             "return sum(1 for ch in s.lower() if ch in ({c!r}, {d!r}))", _letter_pair,
             lambda r: [_word(r)[0] + r.choice(["", "A", "E", "K", "O"])]),
    Template("string", "drop_letters", "s: str", "str",
             "Return s without any {c!r} and without any {d!r}.",
             "return s.replace({c!r}, '').replace({d!r}, '')", _letter_pair, _word),
    Template("string", "pad_left", "s: str", "str",
             "Return s padded on the left with {c!r} to at least {n} characters.",
             "return s.rjust({n}, {c!r})",
             lambda r: {"n": r.randint(3, 12), "c": r.choice(".-*0#_")}, _word),
    Template("string", "swap_upper", "s: str", "str",
             "Return s with every {c!r} replaced by {d!r}, then in upper case.",
             "return s.replace({c!r}, {d!r}).upper()",
             lambda r: dict(zip("cd", r.sample(_LETTERS, 2), strict=True)),
             _word),
    Template("string", "every_kth", "s: str", "str",
             "Return the characters of s at indices {start}, {start} + {k}, {start} + 2 * {k} "
             "and so on, in order.",
             "return s[{start}::{k}]", lambda r: {"k": r.randint(2, 5), "start": r.randint(0, 3)},
             _word),
    Template("list", "sum_above", "xs: list[int]", "int",
             "Return the sum of the elements of xs that are greater than {t}.",
             "return sum(x for x in xs if x > {t})",
             lambda r: {"t": r.randint(-10, 20)}, _int_list),
    Template("list", "sum_below", "xs: list[int]", "int",
             "Return the sum of the elements of xs that are less than {t}.",
             "return sum(x for x in xs if x < {t})",
             lambda r: {"t": r.randint(-10, 20)}, _int_list),
    Template("list", "clip_all", "xs: list[int]", "list[int]",
             "Return a new list: each element of xs limited to the range [{lo}, {hi}].",
             "return [max({lo}, min({hi}, x)) for x in xs]", _clamp_params, _int_list),
    Template("list", "scale_multiples", "xs: list[int]", "list[int]",
             "Return the elements of xs divisible by {k}, in order, each multiplied by {m}.",
             "return [x * {m} for x in xs if x % {k} == 0]",
             lambda r: {"k": r.randint(2, 7), "m": r.randint(2, 9)}, _int_list),
    Template("list", "rotate_left", "xs: list[int]", "list[int]",
             "Return a new list: xs rotated left by {k} positions (an empty list stays "
             "empty).", "return xs[{k} % len(xs):] + xs[:{k} % len(xs)] if xs else []",
             lambda r: {"k": r.randint(1, 12)}, _int_list),
    Template("list", "count_between", "xs: list[int]", "int",
             "Return how many elements of xs are between {lo} and {hi}, both included.",
             "return sum(1 for x in xs if {lo} <= x <= {hi})", _clamp_params, _int_list),
    Template("list", "best_window", "xs: list[int]", "int",
             "Return the largest sum of {k} consecutive elements of xs, or 0 if xs has fewer "
             "than {k} elements.",
             "return max((sum(xs[i:i + {k}]) for i in range(len(xs) - {k} + 1)), default=0)",
             lambda r: {"k": r.randint(2, 5)}, _int_list),
    Template("list", "first_per_remainder", "xs: list[int]", "list[int]",
             "Return the elements of xs in order, keeping only the first element of each "
             "remainder modulo {k}.",
             "seen = set()\n    out = []\n    for x in xs:\n        if x % {k} not in seen:\n"
             "            seen.add(x % {k})\n            out.append(x)\n    return out",
             lambda r: {"k": r.randint(2, 9)}, _int_list),
)


FAMILIES = ("arithmetic", "string", "list")


def reference_code(template: Template, params: Params) -> str:
    return (f"def {template.name}({template.signature}) -> {template.returns}:\n"
            f"    {template.body.format(**params)}\n")


def call_text(name: str, args: list) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def assert_text(name: str, args: list, expected: Any) -> str:
    return f"assert {call_text(name, args)} == {expected!r}"


def _cases(fn: Callable, rng: random.Random, draw: Callable, n: int, avoid: set) -> list:
    cases = []
    for _ in range(20 * n):
        args = draw(rng)
        key = json.dumps(args)
        if key in avoid:
            continue
        avoid.add(key)
        cases.append({"args": args, "expected": fn(*args)})
        if len(cases) == n:
            break
    return cases


def draw_task(rng: random.Random):
    """``(key, make)`` for :func:`mgrpo.envs.worlds.kit.seeded_tasks`."""
    family = rng.choice(FAMILIES)  # each family a third of the draws, whatever its size
    template = rng.choice([t for t in TEMPLATES if t.family == family])
    params = template.params(rng)
    key = f"{template.name}|{json.dumps(params, sort_keys=True)}"
    tests_seed = rng.getrandbits(32)
    return key, lambda: _make(template, params, random.Random(tests_seed))


def _make(template: Template, params: Params, rng: random.Random) -> WorldTask | None:
    code = reference_code(template, params)
    namespace: dict[str, Any] = {}
    exec(compile(code, "<reference>", "exec"), namespace)  # our own template code
    fn = namespace[template.name]
    seen: set[str] = set()
    hidden = _cases(fn, rng, template.inputs, 8, seen)
    expert = _cases(fn, rng, template.inputs, 4, seen)
    example = _cases(fn, rng, template.inputs, 1, seen)
    if len(hidden) < 8 or len(expert) < 4 or not example:
        return None
    shown = example[0]
    statement = (f"Write a Python function `def {template.name}({template.signature}) -> "
                 f"{template.returns}`. {template.description.format(**params)}\n"
                 f"Example: {call_text(template.name, shown['args'])} == "
                 f"{shown['expected']!r}")
    return WorldTask(task_id="", split="", statement=statement,
                     solution={"reference": code, "hidden_tests": hidden},
                     data={"family": template.family, "function": template.name,
                           "params": params, "expert_tests": expert})
