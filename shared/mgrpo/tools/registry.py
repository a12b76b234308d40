"""The tool registry: a tool is one class with a ``name`` and ``run(payload) -> str``.

Register it with ``@register_tool("name")`` (:data:`TOOLS`, a :class:`~mgrpo.registry.Registry`:
``get_tool``, ``tool_names``) and build it by name with ``build_tool("name", **cfg)``; an
unknown name lists the valid ones. Sub-agent roles map
to tools through :data:`ROLE_TOOLS` (the built-in benchmark's searcher and coder).

A run config's ``tools:`` entry configures a tool: ``{search: {k: 1}}`` gives keywords to a
registered tool, ``{websearch: {class: "acme.tools:WebSearch", url: ...}}`` names a class by
import path (no registration needed), ``{calc: {function: "acme.tools:calc"}}`` a plain
function, its schema from its signature and docstring (:mod:`mgrpo.tools.function`).
:func:`build_configured_tool` builds any of them, the same in embedded and distributed mode.
The constructor parameters named in :data:`PROVIDED` are filled by mgrpo, and only for a tool
whose constructor declares them: ``corpus`` (the
benchmark's documents, ``mgrpo.envs.Corpus``) and ``executor`` (the sandbox:
``execute(ExecRequest) -> ExecResult``). Every other parameter comes from the config entry.

What this module does not do: decide which sub-agent gets which tool at run time (the run
config does) or sandbox anything itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from mgrpo.plugins import PluginError, check_call, load_object
from mgrpo.registry import Registry

ROLE_TOOLS: dict[str, str] = {"searcher": "search", "coder": "python"}
# The built-in tools' modules, imported (so they register) on the first look-up: importing the
# registry does not import bm25s, and the registry does not depend on the tools it holds.
BUILTIN_MODULES = ("mgrpo.tools.python", "mgrpo.tools.search")
TOOLS: Registry[type] = Registry(
    "tool", builtins=BUILTIN_MODULES,
    hint="a plug-in tool: import its module (run config `plugins:`, MGRPO_PLUGINS) or give it "
         "a `tools: {NAME: {class: 'pkg.mod:Class'}}` entry")
get_tool = TOOLS.get
tool_names = TOOLS.names


@runtime_checkable
class Tool(Protocol):
    """What a sub-agent calls: ``run`` takes the text inside ``<tool>...</tool>`` and returns
    the observation text (terse; the runner wraps it in ``<obs>...</obs>``). Optional:
    ``description`` (the chat template's tool card) and ``parameters`` (a JSON schema of the
    call's arguments; without it the card takes one string, ``input``)."""

    name: str

    def run(self, payload: str) -> str: ...


def register_tool(name: str, cls: type | None = None):  # type: ignore[no-untyped-def]
    """Make ``build_tool(name, ...)`` construct ``cls`` (and set ``cls.name``); without
    ``cls``, a class decorator that does."""

    def put(tool_cls: type) -> type:
        TOOLS.register(name, tool_cls)
        tool_cls.name = name
        return tool_cls

    return put if cls is None else put(cls)


def build_tool(name: str, **cfg) -> Tool:
    """Construct the tool registered as ``name`` with keyword config ``cfg``."""
    return get_tool(name)(**cfg)


PROVIDED = ("corpus", "executor")


def tool_class(name: str, tools_cfg: Mapping[str, Mapping] | None = None
               ) -> tuple[type, dict[str, Any]]:
    """(class, constructor keywords) of tool ``name``: its ``tools:`` entry's ``class``
    (an import path) or the class registered as ``name``; keywords: the entry minus
    ``class``. Raises a one-line :class:`~mgrpo.plugins.PluginError` for a spec that does
    not resolve and a ``ValueError`` for an unknown name."""
    entry = dict((tools_cfg or {}).get(name) or {})
    if "function" in entry:
        return _function_tool(name, entry)
    spec = entry.pop("class", None)
    if spec is not None:
        return load_object(spec, f"tools.{name}.class"), entry
    return get_tool(name), entry


def _function_tool(name: str, entry: dict) -> tuple[type, dict[str, Any]]:
    """A ``{function: "pkg.mod:fn", description: ...}`` entry: :class:`FunctionTool` and its
    keywords (the function, the entry's name, its description if given)."""
    # here, not at the top: mgrpo.tools.function is only needed for a function entry
    from mgrpo.tools.function import FunctionTool

    spec = entry.pop("function")
    if "class" in entry:
        raise PluginError(f"tools.{name}: give `class` or `function`, not both")
    extra = sorted(set(entry) - {"description"})
    if extra:
        raise PluginError(f"tools.{name}: {spec!r}: a function tool takes `function` and "
                          f"`description` only, got {extra} (its arguments come from the "
                          "model's call; a tool with settings is a class: `class:`)")
    return FunctionTool, {"function": load_object(spec, f"tools.{name}.function"),
                          "name": name, **entry}


def provided_parameters(cls: type) -> list[str]:
    """The :data:`PROVIDED` resources ``cls``'s constructor declares."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    return [p for p in PROVIDED if p in params]


def check_tool(name: str, tools_cfg: Mapping[str, Mapping] | None = None) -> None:
    """Refuse a tool that cannot be built: unknown, a spec that does not resolve, or a
    constructor that does not take the entry's keywords (one line naming the key)."""
    cls, kwargs = tool_class(name, tools_cfg)
    if "function" in (tools_cfg or {}).get(name, {}):
        cls(**kwargs)  # builds its schema: a function it cannot describe is refused now
        return
    spec = (tools_cfg or {}).get(name, {}).get("class") or name
    check_call(cls, f"tools.{name}", spec, kwargs=[*kwargs, *provided_parameters(cls)])
    if not callable(getattr(cls, "run", None)):
        raise PluginError(f"tools.{name}: {spec!r}: found {cls.__name__} without a "
                          "run(payload) -> str method")


def build_configured_tool(name: str, tools_cfg: Mapping[str, Mapping] | None = None,
                          resources: Mapping[str, Callable[[], Any]] | None = None) -> Tool:
    """Construct tool ``name`` as the run config's ``tools:`` says. ``resources``: a
    factory per :data:`PROVIDED` name, called only when the constructor asks for it (so the
    sandbox is not started for a tool that does not run code)."""
    cls, kwargs = tool_class(name, tools_cfg)
    for param in provided_parameters(cls):
        if param in kwargs:
            continue
        factory = (resources or {}).get(param)
        if factory is None:
            raise ValueError(f"tool {name!r} needs {param!r}, which this process does not "
                             "provide")
        kwargs[param] = factory()
    tool = cls(**kwargs)
    if getattr(tool, "name", None) is None:
        tool.name = name
    return tool
