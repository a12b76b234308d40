"""One registry form for every kind of plug-in: algorithms, advantage estimators, engines,
tools, verifiers, judges, workflows, worlds, tool-call parsers and turn formats.

A kind keeps one :class:`Registry` and exposes its three methods under one spelling::

    WORLDS = Registry("world", hint="a world of your own: register_world in a module named "
                                    "under `plugins:`")
    register_world = WORLDS.register   # decorator, or register_world(name, entry)
    get_world = WORLDS.get             # an unknown name lists the valid ones
    world_names = WORLDS.names         # sorted

A second, different entry under a registered name is refused in one line; registering the same
entry again (a module imported twice) is a no-op. ``builtins`` names modules imported on the
first look-up or listing, so that importing a registry never imports what it holds (verl's
``register_adv_est`` / ``get_adv_estimator_fn``, torchtitan's ``register_train_spec``).

What this module does NOT do: build an entry (a kind's ``build_*`` function calls the entry
with its own arguments) or import user plug-ins (:mod:`mgrpo.plugins`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

T = TypeVar("T")


def _same(a: object, b: object) -> bool:
    return a is b or a == b


class Registry(Generic[T]):
    """Named entries of one kind: ``register``, ``get``, ``names``."""

    def __init__(self, kind: str, *, hint: str = "", builtins: tuple[str, ...] = (),
                 same: Callable[[T, T], bool] = _same) -> None:
        self.kind = kind
        self._hint = hint
        self._builtins = builtins
        self._same = same
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: T | None = None):  # type: ignore[no-untyped-def]
        """Register ``entry`` as ``name``; without ``entry``, a decorator that does."""
        def put(value: T) -> T:
            if not name or not isinstance(name, str):
                raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
            known = self._entries.get(name)
            if known is not None and not self._same(known, value):
                raise ValueError(f"{self.kind} {name!r} is already registered "
                                 f"({_label(known)}); pick another name")
            self._entries[name] = value
            return value

        return put if entry is None else put(entry)

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name lists the valid ones."""
        self._load_builtins()
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names()) or "none"
            hint = f" ({self._hint})" if self._hint else ""
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {valid}{hint}") from None

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _load_builtins(self) -> None:
        while self._builtins:
            module, self._builtins = self._builtins[0], self._builtins[1:]
            importlib.import_module(module)


def _label(entry: object) -> str:
    return getattr(entry, "__qualname__", None) or type(entry).__qualname__
