"""The tool registry: a tool is one class with a ``name`` and ``run(payload) -> str``.

Register it with ``@register_tool("name")`` and build it by name with
``build_tool("name", **cfg)``; an unknown name lists the registered ones. Sub-agent roles map
to tools through :data:`ROLE_TOOLS` (the built-in benchmark's searcher and coder).

What this module does not do: decide which sub-agent gets which tool at run time (the run
config does) or sandbox anything itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

ROLE_TOOLS: dict[str, str] = {"searcher": "search", "coder": "python"}

_REGISTRY: dict[str, type] = {}


@runtime_checkable
class Tool(Protocol):
    """What a sub-agent calls: ``run`` takes the text inside ``<tool>...</tool>`` and returns
    the observation text (terse; the runner wraps it in ``<obs>...</obs>``)."""

    name: str

    def run(self, payload: str) -> str: ...


def register_tool(name: str) -> Callable[[type], type]:
    """Class decorator: make ``build_tool(name, ...)`` construct this class."""

    def decorate(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"tool name {name!r} is already registered to "
                             f"{_REGISTRY[name].__qualname__}; choose another name")
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return decorate


def registered_tools() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def build_tool(name: str, **cfg) -> Tool:
    """Construct the tool registered as ``name`` with keyword config ``cfg``."""
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown tool {name!r}; registered tools: {sorted(_REGISTRY)} "
                         "(register a new one with @register_tool)")
    return _REGISTRY[name](**cfg)


def _load_builtins() -> None:
    # Imported lazily so that importing the registry does not import bm25s.
    from mgrpo.tools import python, search  # noqa: F401
