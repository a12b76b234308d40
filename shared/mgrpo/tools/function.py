"""A plain Python function as a tool: ``tools: {calc: {function: "acme.tools:calc"}}``.

The tool's schema is the function's, as TRL's ``GRPOTrainer(tools=[fn])`` and transformers'
chat templates take it (``transformers.utils.get_json_schema``): the name of the ``tools:``
entry, the description from the docstring's first paragraph (the entry's ``description``
replaces it), and one parameter per argument, each with its type hint and its line of the
docstring's ``Args:`` section. With ``protocol.format: chat_template`` the sub-agent sees
this schema in the chat template's ``tools=``, and its call's arguments go to the function
by name. With ``markup`` the text inside ``<tool>...</tool>`` is the function's only
argument (a function of several takes a JSON object of them).

The function's return value is the observation: a string as is, anything else as JSON. A
call that does not fit the signature, or a function that raises, gives a one-line
``error: ...`` observation (the model made the call; TRL does the same), never an
exception.

What this module does not do: run the function in a sandbox (it runs in the sub-agent's
process, as the user wrote it) or time it out.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from mgrpo.plugins import PluginError

MAX_ERROR_CHARS = 200


def function_schema(fn: Callable, name: str, key: str = "tools") -> dict:
    """``{"name", "description", "parameters"}`` of ``fn`` from its signature and docstring
    (``transformers.utils.get_json_schema``); a function it cannot describe (an argument
    without a type hint or without a line under ``Args:``) is a one-line PluginError."""
    # on use: transformers is heavy, and only a function tool needs its schema parser
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)["function"]
    except Exception as exc:  # noqa: BLE001 (DocstringParsingException, TypeHintParsingException)
        raise PluginError(f"{key}: {getattr(fn, '__name__', fn)!r} cannot be a tool: "
                          f"{' '.join(str(exc).split())} (a tool function has a type hint "
                          "and an `Args:` line in its docstring for every argument)") from None
    return {"name": name, "description": schema.get("description", ""),
            "parameters": schema.get("parameters", {"type": "object", "properties": {}})}


class FunctionTool:
    """``function`` as a :class:`~mgrpo.tools.registry.Tool` named ``name``."""

    def __init__(self, function: Callable, name: str, description: str | None = None):
        if not callable(function):
            raise PluginError(f"tools.{name}.function: found {type(function).__name__}, not a "
                              "function")
        schema = function_schema(function, name, key=f"tools.{name}.function")
        self.function, self.name = function, name
        self.description = description or schema["description"] or f"the {name} tool"
        self.parameters: dict = schema["parameters"]

    @property
    def schema(self) -> dict:
        """The OpenAI-style tool schema (what the chat template's ``tools=`` takes)."""
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}

    def arguments(self, payload: str) -> dict[str, Any] | str:
        """The keyword arguments of one call's ``payload``, or why it does not fit: a
        function of one argument takes the payload itself (read as JSON when that argument
        is not a string), one of several a JSON object of its arguments."""
        props = self.parameters.get("properties", {})
        if len(props) == 1:
            (arg, spec), = props.items()
            if spec.get("type") in (None, "string"):
                return {arg: payload}
            try:
                return {arg: json.loads(payload)}
            except json.JSONDecodeError:
                return f"{arg} must be {spec.get('type')}, got {payload[:60]!r}"
        try:
            args = json.loads(payload) if payload.strip() else {}
        except json.JSONDecodeError:
            return f"expected a JSON object of {sorted(props)}, got {payload[:60]!r}"
        if not isinstance(args, dict):
            return f"expected a JSON object of {sorted(props)}, got {payload[:60]!r}"
        return args

    def run(self, payload: str) -> str:
        args = self.arguments(payload)
        if isinstance(args, str):
            return _one_line(f"error: {args}")
        try:
            inspect.signature(self.function).bind(**args)
        except TypeError as exc:
            return _one_line(f"error: {exc}")
        try:
            result = self.function(**args)
        except Exception as exc:  # noqa: BLE001 (the user's function; the model sees why)
            return _one_line(f"error: {type(exc).__name__}: {exc}")
        return result if isinstance(result, str) else json.dumps(result, default=str)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS - 3] + "..."
