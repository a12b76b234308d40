"""The verifier registry: r_correct of the planner's final answer, by name or import path.

The run config's ``verifier:`` is a name of :data:`VERIFIERS` (a
:class:`~mgrpo.registry.Registry`: ``register_verifier``, ``get_verifier``,
``verifier_names``) or ``"pkg.mod:function"``: a function ``(question: str, answer: str,
gold: str) -> float`` in [0, 1]. Built in: ``exact``
(:class:`~mgrpo.envs.rewards.ExactMatchVerifier`) and ``llm``
(:class:`~mgrpo.envs.rewards.LLMJudgeVerifier`, built with an engine by
``mgrpo.training.judging.verifier_for_run``); :func:`register_verifier` adds a function.
:func:`build_verifier` builds any of them. Every verifier a run uses is wrapped in
:class:`GuardedVerifier`: a call that raises, or returns a non-number, NaN or a value
outside [0, 1], scores 0 and is counted with its reason (``errors``, ``reasons``; the metric
``planner/verifier_errors``), so a user's bug never crashes a round and never passes
unnoticed.

What this module does not do: load engines (``mgrpo.training.judging``) or weight r_correct
into R_M (``mgrpo.algo.rewards``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from mgrpo.envs.rewards import ExactMatchVerifier, LLMJudgeVerifier
from mgrpo.plugins import check_call, is_import_path, load_object
from mgrpo.registry import Registry

log = logging.getLogger(__name__)

# name -> a verifier class (built with the run's context: ``llm`` takes an engine) or a
# function (question, answer, gold) -> float
VERIFIERS: Registry[Callable[..., Any]] = Registry(
    "verifier", hint="a verifier of your own: register_verifier in a module named under "
                     "`plugins:`, or the spec 'pkg.mod:function'")
VERIFIERS.register("exact", ExactMatchVerifier)
VERIFIERS.register("llm", LLMJudgeVerifier)
get_verifier = VERIFIERS.get
verifier_names = VERIFIERS.names


def register_verifier(name: str, fn: Callable | None = None):  # type: ignore[no-untyped-def]
    """``verifier: NAME`` uses the function ``fn`` ``(question, answer, gold) -> float`` (a
    plug-in module registers it on import); without ``fn``, a decorator that does."""

    def put(f: Callable) -> Callable:
        check_call(f, f"register_verifier({name!r})", f.__name__, args=3)
        return VERIFIERS.register(name, f)

    return put if fn is None else put(fn)


class FunctionVerifier:
    """A function ``(question, answer, gold) -> float`` as a verifier."""

    def __init__(self, fn: Callable[[str, str, str], float]):
        self.fn = fn

    def score(self, pred: str, gold: str, question: str | None = None) -> float:
        return self.fn(question or "", pred or "", gold)


def check_verifier(spec: str, key: str = "verifier") -> None:
    """Refuse a ``verifier:`` that is neither a known name nor a usable import path."""
    if spec in VERIFIERS:
        return
    if not is_import_path(spec):
        raise ValueError(f"{key}: {spec!r}: not a verifier; use one of "
                         f"{verifier_names()} or 'pkg.mod:function'")
    check_call(load_object(spec, key), key, spec, args=3)


def build_verifier(spec: str, **context: Any) -> Any:
    """The (unguarded) verifier ``spec`` names: a registered class built with ``context``
    (``llm``: ``engine=``, ``prompt_path=``, ``tokenizer=``, ``max_new_tokens=``), a
    registered function or an import path's as a :class:`FunctionVerifier`."""
    check_verifier(spec)
    if spec not in VERIFIERS:
        return FunctionVerifier(load_object(spec, "verifier"))
    entry = get_verifier(spec)
    return entry(**context) if isinstance(entry, type) else FunctionVerifier(entry)


class GuardedVerifier:
    """``inner``'s scores, with every failure scored 0 and counted (thread-safe)."""

    def __init__(self, inner: Any, name: str = ""):
        self.inner, self.name = inner, name or type(inner).__name__
        self.errors = 0
        self.reasons: Counter[str] = Counter()
        self._lock = threading.Lock()

    def score(self, pred: str, gold: str, question: str | None = None) -> float:
        try:
            value = self.inner.score(pred, gold, question)
        except Exception as exc:  # noqa: BLE001 (a user's verifier: any bug scores 0)
            return self._fail(f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:120]}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:  # numpy / torch scalars
                value = float(value)
            except (TypeError, ValueError):
                return self._fail(f"returned {type(value).__name__}, not a number")
        value = float(value)
        if math.isnan(value) or not 0.0 <= value <= 1.0:
            return self._fail(f"returned {value}, outside [0, 1]")
        return value

    def _fail(self, reason: str) -> float:
        with self._lock:
            self.errors += 1
            first = reason not in self.reasons
            self.reasons[reason] += 1
        if first:
            log.warning("verifier %s: %s (scored 0; counted as planner/verifier_errors)",
                        self.name, reason)
        return 0.0
