"""Tools as plain functions from a user's package (``acme_task.tools:calc`` and ``convert``,
outside the library): the schema from the signature and docstring, the same tool built in
embedded mode and by a sub-agent service, shown in the chat template's ``tools=`` and called
with the model's arguments; the planner's card of the sub-agent reads the config's
description."""

from __future__ import annotations

import json

import pytest
from chat_tokenizer import chat_tokenizer
from pydantic import ValidationError

from mgrpo.config import Settings
from mgrpo.engines.base import Completion
from mgrpo.envs.chat_format import ChatTemplateFormat
from mgrpo.services.context import tool_for_run
from mgrpo.tools import build_configured_tool
from mgrpo.training.config import RunConfig, SamplingConfig
from mgrpo.training.episodes import AgentRuntime, SubagentCall
from mgrpo.training.subagents import run_subagent_calls
from mgrpo.training.system import build_tools, role_cards, role_description

END = "<|im_end|>"
CALC_DOC = "Evaluate an arithmetic expression of numbers, + - * / and parentheses."


def _cfg(**tools) -> RunConfig:
    return RunConfig.model_validate({
        "plugins": ["acme_task"], "models": {"m": {"path": "unused"}},
        "agents": {"planner": "m", "calc": {"model": "m", "description": "does arithmetic"},
                   "convert": "m"},
        "tools": tools or {"calc": {"function": "acme_task.tools:calc"},
                           "convert": {"function": "acme_task.tools:convert",
                                       "description": "metres of a distance"}},
        "role_tools": {"calc": "calc", "convert": "convert"}})


def _call(name: str, **args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>{END}"


def test_the_schema_comes_from_the_signature_and_docstring():
    cfg = _cfg()
    calc = build_configured_tool("calc", cfg.tools)
    assert (calc.name, calc.description) == ("calc", CALC_DOC)
    assert calc.parameters == {"type": "object", "required": ["expression"], "properties": {
        "expression": {"type": "string", "description": 'The expression, e.g. "2 * (3 + 4)".'}}}
    assert calc.run("2 * (3 + 4)") == "14"
    assert calc.run("__import__('os')") == ("error: ValueError: not arithmetic: "
                                            "\"__import__('os')\"")
    convert = build_configured_tool("convert", cfg.tools)
    assert convert.description == "metres of a distance"  # the config's, over the docstring
    assert convert.parameters["required"] == ["value"]
    assert convert.run('{"value": 2}') == '{"metres": 2000.0}'
    assert convert.run("2").startswith("error: expected a JSON object of ['unit', 'value']")
    assert convert.run('{"value": 2, "speed": 1}').startswith("error: got an unexpected")


def test_embedded_and_services_build_the_same_tool():
    cfg = _cfg()
    embedded = build_tools(None, ["calc"], None, cfg.tools, cfg.role_tools)["calc"]
    served = tool_for_run(cfg, "calc", Settings())
    assert embedded.schema == served.schema
    assert embedded.schema["function"]["parameters"]["properties"].keys() == {"expression"}


def test_a_config_the_function_does_not_fit_is_refused_in_one_line():
    with pytest.raises(ValidationError, match=r"tools.calc: 'acme_task.tools:calc': a function "
                       r"tool takes `function` and `description` only, got \['descripton'\]"):
        _cfg(calc={"function": "acme_task.tools:calc", "descripton": "x"})
    with pytest.raises(ValidationError, match=r"tools.calc.function: 'HttpSearch' cannot be a "
                       "tool: .*type hint"):
        _cfg(calc={"function": "acme_task.tools:HttpSearch"})
    with pytest.raises(ValidationError, match=r"descriptions.nobody: not a sub-agent role"):
        RunConfig.model_validate({**_cfg().model_dump(), "descriptions": {"nobody": "x"}})


def test_the_chat_template_shows_the_functions_schema_and_calls_it_with_its_arguments():
    cfg, fmt = _cfg(), ChatTemplateFormat(chat_tokenizer())
    tools = build_tools(None, ["calc", "convert"], None, cfg.tools, cfg.role_tools)
    dialogue = fmt.subagent("calc", "what is 6 * 7?", tools["calc"],
                            role_description("calc", cfg.descriptions))
    text = fmt.tokenizer.decode(dialogue.start_ids())
    assert json.dumps(tools["calc"].schema) in text  # the template's tools= block, as given
    assert "You are the calc agent (does arithmetic)" in text
    action = dialogue.parse(_call("calc", expression="6 * 7"))
    assert (action.kind, tools["calc"].run(action.payload)) == ("tool", "42")
    assert "takes one non-empty string argument 'expression'" in dialogue.parse(
        _call("calc", expr="6 * 7")).error
    dialogue = fmt.subagent("convert", "2 miles?", tools["convert"])
    action = dialogue.parse(_call("convert", value=2, unit="mi"))
    assert json.loads(tools["convert"].run(action.payload)) == {"metres": 3218.688}
    bad = dialogue.parse(_call("convert", unit="mi"))
    assert bad.kind == "invalid" and "required ['value']" in bad.error


def test_the_planners_card_reads_the_configs_description():
    cfg, fmt = _cfg(), ChatTemplateFormat(chat_tokenizer())
    cards = role_cards(cfg.agents, cfg.descriptions)
    assert [(c.name, c.description) for c in cards] == [("calc", "does arithmetic"),
                                                        ("convert", "convert")]
    planner = fmt.planner("6 * 7?", cards)
    assert planner.tools[0]["function"]["description"] == "does arithmetic"


class _TwoTurns:
    """An engine that calls the tool on the first turn and returns its output on the next."""

    version = 0

    def __init__(self, tokenizer):
        self.tokenizer, self.turns = tokenizer, 0

    def generate(self, requests):
        out = []
        for request in requests:
            self.turns += 1
            text = _call("calc", expression="6 * 7") if self.turns == 1 else f"42{END}"
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Completion(list(request.prompt_ids), ids, [-0.1] * len(ids), text,
                                  "stop"))
        return out


def test_a_sub_agent_calls_the_function_in_its_loop():
    cfg, tok = _cfg(), chat_tokenizer()
    tool = build_tools(None, ["calc"], None, cfg.tools, cfg.role_tools)["calc"]
    runtime = AgentRuntime(role="calc", model="m", engine=_TwoTurns(tok), tokenizer=tok,
                           tool=tool, description="does arithmetic",
                           turn_format=ChatTemplateFormat(tok))
    (outcome,) = run_subagent_calls(runtime, [SubagentCall(("r", "q", 0), "calc", "6 * 7?", 0,
                                                           seed=1)],
                                    SamplingConfig(subagent_max_turns=2, max_new_tokens=32))
    assert outcome.result == "42"
    (step,) = outcome.trace[0]["steps"]
    assert (step["tool"], step["input"], step["observation"]) == ("calc", "6 * 7", "42")
