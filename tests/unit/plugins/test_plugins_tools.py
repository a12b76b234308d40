"""Plug-in tools: a ``tools:`` entry with ``class: "pkg.mod:Class"`` and its keywords, built the
same by embedded mode (``training.system.build_tools``) and a sub-agent service
(``services.context.tool_for_run``); ``executor``/``corpus`` go only to a constructor that
declares them; a bad spec is refused when the run config is validated, in one line."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest
from pydantic import ValidationError

from mgrpo.config import Settings
from mgrpo.plugins import PluginError, import_plugins, load_object
from mgrpo.training.config import RunConfig
from mgrpo.validation import one_line

PLUGIN = '''
from mgrpo.tools import register_tool


class WebSearch:
    """A tool with its own constructor: no executor, no corpus."""

    def __init__(self, url, k=3):
        self.url, self.k = url, k

    def run(self, payload):
        return f"{self.url}?q={payload}&k={self.k}"


class NeedsSandbox:
    def __init__(self, executor, label="x"):
        self.executor, self.label = executor, label

    def run(self, payload):
        return self.label


@register_tool("{registered}")
class Calendar:
    def __init__(self, db_path="cal.db"):
        self.db_path = db_path

    def run(self, payload):
        return "calendar " + self.db_path
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A fresh importable module (unique name, so the tool registry never sees it twice)."""
    name = f"acme_{uuid.uuid4().hex[:8]}"
    registered = f"calendar_{name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN).replace("{registered}",
                                                                         registered))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, registered
    sys.modules.pop(name, None)


def _cfg(tmp_path, **kw) -> RunConfig:
    models = {m: {"path": str(tmp_path / m)} for m in ("planner", "searcher", "web")}
    return RunConfig.model_validate({"models": models, "agents": {"planner": "planner",
                                                                  "web": "web"}, **kw})


def test_class_spec_kwargs_reach_the_constructor_in_both_modes(plugin, tmp_path):
    from mgrpo.services.context import tool_for_run
    from mgrpo.training.system import build_tools

    mod, _ = plugin
    cfg = _cfg(tmp_path, tools={"websearch": {"class": f"{mod}:WebSearch",
                                              "url": "http://127.0.0.1:9", "k": 5}},
               role_tools={"web": "websearch"})
    embedded = build_tools(None, ["web"], None, cfg.tools, cfg.role_tools)["web"]
    served = tool_for_run(cfg, "websearch", Settings())
    for tool in (embedded, served):
        assert type(tool).__name__ == "WebSearch"
        assert tool.run("q") == "http://127.0.0.1:9?q=q&k=5"
        assert tool.name == "websearch"


def test_executor_goes_only_to_a_tool_that_declares_it(plugin, tmp_path):
    from mgrpo.training.system import build_tools

    mod, registered = plugin
    cfg = _cfg(tmp_path, plugins=[mod],
               tools={"sandboxed": {"class": f"{mod}:NeedsSandbox", "label": "y"}},
               role_tools={"web": registered})
    # the registered tool has no executor parameter: built without one (no TypeError)
    assert build_tools(None, ["web"], None, cfg.tools, cfg.role_tools)["web"].run("") == \
        "calendar cal.db"
    marker = object()
    tool = build_tools(None, ["web"], marker, cfg.tools, {"web": "sandboxed"})["web"]
    assert tool.executor is marker and tool.run("") == "y"


def test_plugins_key_imports_the_module_so_its_registered_tool_is_found(plugin, tmp_path):
    mod, registered = plugin
    with pytest.raises(ValidationError, match="unknown tool"):
        _cfg(tmp_path, role_tools={"web": registered})
    cfg = _cfg(tmp_path, plugins=[mod], role_tools={"web": registered})
    assert mod in sys.modules and cfg.role_tools["web"] == registered


@pytest.mark.parametrize("spec, found", [
    ("acme_missing_pkg.tools:WebSearch", "no module named 'acme_missing_pkg'"),
    ("{mod}:WebSerch", "has no attribute 'WebSerch'"),
    ("{mod}", "not an import path"),
])
def test_a_bad_class_spec_is_refused_in_one_line(plugin, tmp_path, spec, found):
    mod, _ = plugin
    spec = spec.replace("{mod}", mod)
    with pytest.raises(ValidationError) as info:
        _cfg(tmp_path, tools={"websearch": {"class": spec, "url": "u"}})
    message = one_line(info.value)
    assert "\n" not in message
    assert "tools.websearch.class" in message and repr(spec) in message and found in message


def test_wrong_constructor_keywords_are_refused_before_anything_runs(plugin, tmp_path):
    mod, _ = plugin
    with pytest.raises(ValidationError) as info:
        _cfg(tmp_path, tools={"websearch": {"class": f"{mod}:WebSearch", "adress": "u"}})
    message = one_line(info.value)
    assert "tools.websearch" in message and "WebSearch(url, k=3)" in message
    assert "adress" in message


def test_a_missing_plugin_module_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="plugins: 'acme_nowhere': no module named"):
        _cfg(tmp_path, plugins=["acme_nowhere"])


def test_a_module_that_raises_on_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "acme_broken.py").write_text("raise RuntimeError('no API key')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="importing 'acme_broken' raised RuntimeError: "
                                          "no API key"):
        import_plugins(["acme_broken"])
    with pytest.raises(PluginError, match="has no attribute 'nope'"):
        load_object("os.path:nope", "verifier")


def test_builtin_tools_still_build_from_their_config(bench, tmp_path):
    from mgrpo.training.system import build_tools

    tools = build_tools(bench, ["searcher", "coder"], None, {"search": {"k": 1}})
    assert tools["searcher"].config.k == 1 and tools["coder"].run("print(6*7)") == "42"


@pytest.mark.parametrize("tools, found", [
    ({"serach": {"k": 1}}, "unknown tool 'serach'"),
    ({"search": {"kk": 1}}, "tools.search: 'search': found SearchTool"),
])
def test_a_mistyped_tool_entry_is_refused(tmp_path, tools, found):
    with pytest.raises(ValidationError) as info:
        _cfg(tmp_path, tools=tools)
    assert found in one_line(info.value)
