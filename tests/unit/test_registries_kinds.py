"""Every plug-in kind speaks the one registry form (``mgrpo.registry``): ``register_<kind>``,
``get_<kind>``, ``<kind>_names``; a second, different entry under a taken name is refused in
one line (the same entry again is not); an unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from mgrpo.engines import registry as engines
from mgrpo.envs import chat_format, judges, turn_formats, verifiers
from mgrpo.envs.worlds import base as worlds
from mgrpo.registry import Registry
from mgrpo.tools import registry as tools
from mgrpo.training import runners
from mgrpo.workflows import Workflow
from mgrpo.workflows import base as workflows


@dataclass(frozen=True)
class Kind:
    registry: Registry
    register: Callable[[str, int], Any]  # registers entry number 0 or 1 (different entries)
    get: Callable[[str], Any]
    names: Callable[[], list[str]]
    builtin: str


def _fn3(tag: int) -> Callable[[str, str, str], float]:
    def fn(a: str, b: str, c: str) -> float:
        return float(tag)

    fn.__qualname__ = f"fn{tag}"
    return fn


def _cls(tag: int) -> type:
    return type(f"Entry{tag}", (), {"run": lambda self, payload: ""})


_FNS = {tag: _fn3(tag) for tag in (0, 1)}
_CLASSES = {tag: _cls(tag) for tag in (0, 1)}
_FLOWS: dict[tuple[str, int], type] = {}


def _same_flow(name: str, tag: int) -> Workflow:
    """A new instance of one class per (name, tag): a module imported twice."""
    if (name, tag) not in _FLOWS:
        _FLOWS[name, tag] = type(f"Flow{tag}", (Workflow,), {"name": name})
    return _FLOWS[name, tag]()


def _train0(*a):
    return None


def _train1(*a):
    return None


KINDS = {
    "engine": Kind(engines.ENGINES,
                   lambda n, t: engines.register_engine(n, _FNS[t]),
                   engines.get_engine, engines.engine_names, "torch"),
    "tool": Kind(tools.TOOLS, lambda n, t: tools.register_tool(n, _CLASSES[t]),
                 tools.get_tool, tools.tool_names, "search"),
    "verifier": Kind(verifiers.VERIFIERS, lambda n, t: verifiers.register_verifier(n, _FNS[t]),
                     verifiers.get_verifier, verifiers.verifier_names, "exact"),
    "judge": Kind(judges.JUDGES, lambda n, t: judges.register_judge(n, _FNS[t]),
                  judges.get_judge, judges.judge_names, "llm"),
    "workflow": Kind(workflows.WORKFLOWS,
                     lambda n, t: workflows.register_workflow(_same_flow(n, t)),
                     workflows.get_workflow, workflows.workflow_names, "hierarchy"),
    "world": Kind(worlds.WORLDS, lambda n, t: worlds.register_world(n, _CLASSES[t]),
                  worlds.get_world, worlds.world_names, "plan_path"),
    "tool_call_format": Kind(
        chat_format.TOOL_CALL_FORMATS,
        lambda n, t: chat_format.register_tool_call_format(
            n, chat_format.ToolCallFormat(chat_format.parse_hermes, _FNS[t])),
        chat_format.get_tool_call_format, chat_format.tool_call_format_names, "hermes"),
    "turn format": Kind(turn_formats.TURN_FORMATS,
                        lambda n, t: turn_formats.register_turn_format(n, _FNS[t]),
                        turn_formats.get_turn_format, turn_formats.turn_format_names,
                        "markup"),
    "runner": Kind(runners.RUNNERS,
                   lambda n, t: runners.register_runner(n, (_train0, _train1)[t]),
                   runners.get_runner, runners.runner_names, "turn_team"),
}


@pytest.fixture(params=sorted(KINDS))
def kind(request, monkeypatch) -> tuple[str, Kind]:
    found = KINDS[request.param]
    found.names()  # the built-ins imported first, so the copy below holds them
    monkeypatch.setattr(found.registry, "_entries", dict(found.registry._entries))
    return request.param, found


def test_each_kind_is_its_registry_under_its_own_name(kind):
    name, found = kind
    assert found.registry.kind == name
    assert found.builtin in found.names() and found.names() == sorted(found.names())
    assert found.get(found.builtin) is not None


def test_a_different_entry_under_a_taken_name_is_refused_in_one_line(kind):
    name, found = kind
    found.register("dup_test", 0)
    found.register("dup_test", 0)  # the same entry again (a module imported twice): fine
    with pytest.raises(ValueError) as err:
        found.register("dup_test", 1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{name} 'dup_test' is already registered (")
    assert message.endswith("); pick another name")
    assert "dup_test" in found.names()


def test_an_unknown_name_lists_the_valid_ones(kind):
    name, found = kind
    with pytest.raises(ValueError) as err:
        found.get("no_such_entry")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"unknown {name} 'no_such_entry'; valid: "
                              f"{', '.join(found.names())}")


def test_the_spec_forms_list_the_valid_names_too():
    """Engines and verifiers also take a spec (a URL, an import path): refusing one lists
    the registered names and the spec forms."""
    with pytest.raises(ValueError, match=r"unknown engine 'sglang': use torch, vllm, an "):
        engines.engine_kind("sglang")
    with pytest.raises(ValueError) as err:
        verifiers.check_verifier("exactt")
    assert f"not a verifier; use one of {verifiers.verifier_names()} or" in str(err.value)
    with pytest.raises(ValueError) as err:
        judges.check_judge_kind("rules", "judges.searcher.kind")
    assert f"use one of {', '.join(judges.judge_names())} or 'pkg.mod:function'" in \
        str(err.value)
