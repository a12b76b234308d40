"""A user's code by import path: plug-in modules and ``"pkg.mod:attr"`` specs.

- :func:`import_plugins`: import the modules a run names (run config ``plugins:``, and for
  services the comma-separated ``MGRPO_PLUGINS``), so that their ``@register_tool`` (and any
  other registration) runs before anything is built. Every process does this first: ``mgrpo``
  itself (the environment variable, for every command and service), and every process that
  validates a run config (its ``plugins:``).
- :func:`load_object`: resolve ``"pkg.mod:attr"`` (``attr`` may be dotted) to the object.
- :func:`check_call`: check that a resolved function or class accepts the arguments it will
  be called with, so a wrong signature is refused before anything runs.

Every failure is a :class:`PluginError` (a ``ValueError``) with one line naming the config
key, the spec and what was found.

What this module does not do: decide what a resolved object is for (the tool, verifier and
judge registries do) or install anything (a plug-in is an importable module: installed, or on
``PYTHONPATH``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

PLUGINS_ENV = "MGRPO_PLUGINS"
_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PluginError(ValueError):
    """A plug-in module or import-path spec that cannot be used; the message is one line."""


def is_import_path(text: str) -> bool:
    """True for ``"pkg.mod:attr"`` (a module path, a colon, an attribute path)."""
    return bool(_SPEC.match(text))


def _import_module(module: str, key: str, spec: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        found = (f"no module named {missing!r}" if missing == module or
                 module.startswith(missing + ".") else
                 f"importing {module!r} failed: no module named {missing!r}")
        raise PluginError(f"{key}: {spec!r}: {found} (is its folder on PYTHONPATH or the "
                          "package installed?)") from None
    except Exception as exc:  # noqa: BLE001 (the user's module raised while importing)
        line = " ".join(str(exc).split())[:300]
        raise PluginError(f"{key}: {spec!r}: importing {module!r} raised "
                          f"{type(exc).__name__}: {line}") from exc


def import_plugins(modules: Iterable[str], key: str = "plugins") -> None:
    """Import each module (idempotent: Python caches modules)."""
    for module in modules:
        module = module.strip()
        if not module:
            continue
        if not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", module):
            raise PluginError(f"{key}: {module!r}: not a module path (expected e.g. "
                              "acme_task.tools)")
        if module not in sys.modules:
            _import_module(module, key, module)


def import_env_plugins() -> None:
    """Import the modules of ``MGRPO_PLUGINS`` (comma-separated), if set."""
    value = os.environ.get(PLUGINS_ENV, "")
    if value.strip():
        import_plugins(value.split(","), key=PLUGINS_ENV)


def load_object(spec: str, key: str) -> Any:
    """The object at ``"pkg.mod:attr"``; ``key`` names the config key in errors."""
    if not isinstance(spec, str) or not is_import_path(spec):
        raise PluginError(f"{key}: {spec!r}: not an import path (expected "
                          "'package.module:name')")
    module_path, _, attr_path = spec.partition(":")
    obj = _import_module(module_path, key, spec)
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(obj) if not n.startswith("_"))[:12]
            raise PluginError(f"{key}: {spec!r}: {module_path!r} has no attribute {part!r} "
                              f"(it has {public})")
        obj = getattr(obj, part)
    return obj


def check_call(obj: Any, key: str, spec: str, args: int = 0,
               kwargs: Iterable[str] = ()) -> None:
    """Refuse ``obj`` unless ``obj(*args positional, **kwargs)`` binds (a class: its
    constructor). ``args`` is a count; ``kwargs`` the keyword names that will be passed."""
    if not callable(obj):
        raise PluginError(f"{key}: {spec!r}: found {type(obj).__name__} {obj!r}, not a "
                          "function or class")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    try:
        signature.bind(*([None] * args), **dict.fromkeys(kwargs))
    except TypeError as exc:
        raise PluginError(f"{key}: {spec!r}: found {getattr(obj, '__name__', obj)}"
                          f"{signature}, which cannot take {describe_call(args, kwargs)} "
                          f"({exc})") from None


def describe_call(args: int, kwargs: Iterable[str]) -> str:
    names = list(kwargs)
    parts = [f"{args} positional argument{'s' if args != 1 else ''}"] if args else []
    if names:
        parts.append("keywords " + ", ".join(names))
    return " and ".join(parts) or "no arguments"
