"""The verifier registry: r_correct of the planner's final answer, by name or import path.

The run config's ``verifier:`` is ``exact`` (:class:`~mgrpo.envs.rewards.ExactMatchVerifier`),
``llm`` (:class:`~mgrpo.envs.rewards.LLMJudgeVerifier`, built with an engine by
``mgrpo.training.judging.build_verifier``), a name registered with :func:`register_verifier`,
or ``"pkg.mod:function"``: a function ``(question: str, answer: str, gold: str) -> float``
in [0, 1]. Every verifier a run uses is wrapped in :class:`GuardedVerifier`: a call that
raises, or returns a non-number, NaN or a value outside [0, 1], scores 0 and is counted with
its reason (``errors``, ``reasons``; the metric ``planner/verifier_errors``), so a user's bug
never crashes a round and never passes unnoticed.

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

from mgrpo.envs.rewards import ExactMatchVerifier
from mgrpo.plugins import check_call, is_import_path, load_object

log = logging.getLogger(__name__)

# name -> factory(**context) -> an object with score(pred, gold, question) -> float.
# ``llm`` is built by mgrpo.training.judging (it needs an engine).
_REGISTRY: dict[str, Callable[..., Any]] = {"exact": lambda **_: ExactMatchVerifier()}
BUILT_BY_TRAINING = ("llm",)


def register_verifier(name: str) -> Callable[[Callable], Callable]:
    """Decorator: ``verifier: NAME`` uses this function ``(question, answer, gold) ->
    float`` (a plug-in module registers it on import)."""

    def decorate(fn: Callable) -> Callable:
        check_call(fn, f"register_verifier({name!r})", fn.__name__, args=3)
        _REGISTRY[name] = lambda **_: FunctionVerifier(fn)
        return fn

    return decorate


def registered_verifiers() -> list[str]:
    return sorted([*_REGISTRY, *BUILT_BY_TRAINING])


class FunctionVerifier:
    """A function ``(question, answer, gold) -> float`` as a verifier."""

    def __init__(self, fn: Callable[[str, str, str], float]):
        self.fn = fn

    def score(self, pred: str, gold: str, question: str | None = None) -> float:
        return self.fn(question or "", pred or "", gold)


def check_verifier(spec: str, key: str = "verifier") -> None:
    """Refuse a ``verifier:`` that is neither a known name nor a usable import path."""
    if spec in _REGISTRY or spec in BUILT_BY_TRAINING:
        return
    if not is_import_path(spec):
        raise ValueError(f"{key}: {spec!r}: not a verifier; use one of "
                         f"{registered_verifiers()} or 'pkg.mod:function'")
    check_call(load_object(spec, key), key, spec, args=3)


def make_verifier(spec: str) -> Any:
    """The (unguarded) verifier named by ``spec``, for any spec but ``llm``."""
    check_verifier(spec)
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    return FunctionVerifier(load_object(spec, "verifier"))


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
