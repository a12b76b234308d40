"""Agent turns in the model's own chat format (``protocol.format: chat_template``).

Every agent context is a conversation rendered by ``tokenizer.apply_chat_template``:

- planner: a system prompt (``prompts/chat_planner_system.txt``), the question as the user
  turn, and one tool per sub-agent (``{"task": string}``) passed as ``tools=``, so the template
  shows them in the model's native tool format. A turn with one tool call delegates; the
  sub-agent's result comes back as a ``tool`` message. A turn without a tool call is the answer.
- sub-agent: a system prompt (``prompts/chat_subagent_system.txt``), the task as the user turn
  and its tool: its own schema when it has ``parameters`` (a function tool,
  :mod:`mgrpo.tools.function`), else ``{"input": string}``. A tool call runs the tool, whose
  output comes back as a ``tool`` message; a turn without a tool call is the result.

Tool calls are read back and written (the expert demonstrations) in a format of
:data:`TOOL_CALL_FORMATS` (a :class:`~mgrpo.registry.Registry`: ``register_tool_call_format``,
``get_tool_call_format``, ``tool_call_format_names``; ``hermes``: Qwen2.5, Hermes and others,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; ``json_list``: SmolLM2, the same
inside a JSON list). The
template must show the tools it is given (``tools=``): one that drops them is refused, and
``chat_template`` (a built-in name or a Jinja file's text) replaces the tokenizer's own. A turn that
does not end with the template's end-of-turn token, holds a malformed or unclosed call, more
than one call, an unknown tool or wrong arguments, or nothing at all is an ``invalid`` action
with its reason (the runner ends the episode; r_format is 0).

Token ids, as verl's multi-turn rollout builds them (a new message is the template's
rendering delta), with the conversation itself as the base and the sampled ids kept: the
prompt is the rendered conversation (mask 0); a turn is the sampled ids, ending with the
end-of-turn token (mask 1); what follows a turn is the text the template adds between the
end of that turn and the next generation prompt, rendered with the turn (as its
``content``, verbatim) and the new ``tool`` message, tokenised (mask 0). So the context is
the template's rendering of the conversation, sampled ids kept as sampled; a template that
re-renders earlier turns differently (it is not append-only) is refused in one line.

Text from outside (question, task, results, observations) has the tokenizer's added tokens
removed, so a tool cannot forge a turn.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgrpo.envs.protocol import AgentCard, PlannerAction, SubagentAction
from mgrpo.registry import Registry

PROMPTS = Path(__file__).parent / "prompts"
_SENTINEL = "\x00mgrpo-turn\x00"


def parse_hermes(content: str) -> tuple[list[tuple[str, dict]], str] | str:
    """``([(name, arguments), ...], text outside the calls)`` of ``<tool_call>{json}
    </tool_call>`` blocks, or the reason they are malformed. A block may hold one call object
    or a JSON list of them (``<tool_call>[{"name": ..., "arguments": ...}]</tool_call>``,
    SmolLM2's form)."""
    opens, closes = content.count("<tool_call>"), content.count("</tool_call>")
    if opens != closes:
        return f"unbalanced tool calls: {opens} <tool_call> and {closes} </tool_call>"
    calls = []
    for inner in re.findall(r"<tool_call>(.*?)</tool_call>", content, flags=re.S):
        try:
            block = json.loads(inner)
        except (json.JSONDecodeError, RecursionError) as err:
            reason = getattr(err, "msg", "nested too deeply")
            return f"tool call is not JSON ({reason}): {inner.strip()[:80]!r}"
        for call in block if isinstance(block, list) else [block]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return f"tool call needs a string \"name\": {inner.strip()[:80]!r}"
            args = call.get("arguments", {})
            if isinstance(args, str):
                with contextlib.suppress(json.JSONDecodeError, RecursionError):
                    args = json.loads(args)
            if not isinstance(args, dict):
                return f"tool call \"arguments\" must be an object: {inner.strip()[:80]!r}"
            calls.append((call["name"], args))
    return calls, re.sub(r"<tool_call>.*?</tool_call>", "", content, flags=re.S)


def write_hermes(name: str, arguments: dict) -> str:
    """A call as Qwen2.5 and Hermes write it: ``<tool_call>\\n{json}\\n</tool_call>``."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def write_json_list(name: str, arguments: dict) -> str:
    """A call as SmolLM2 writes it: ``<tool_call>[{json}]</tool_call>``."""
    return f"<tool_call>{json.dumps([{'name': name, 'arguments': arguments}])}</tool_call>"


@dataclass(frozen=True)
class ToolCallFormat:
    """How one model family writes a tool call (``write``: the expert demonstrations) and
    how a turn's calls are read back (``parse``: rollouts)."""

    parse: Callable[[str], tuple[list[tuple[str, dict]], str] | str]
    write: Callable[[str, dict], str]


# protocol.tool_call_format -> its format. Both built-ins read either form; they differ in
# what the demonstrations write.
TOOL_CALL_FORMATS: Registry[ToolCallFormat] = Registry(
    "tool_call_format", hint="a format of your own: register_tool_call_format in a module "
                             "named under `plugins:`")
register_tool_call_format = TOOL_CALL_FORMATS.register
get_tool_call_format = TOOL_CALL_FORMATS.get
tool_call_format_names = TOOL_CALL_FORMATS.names
register_tool_call_format("hermes", ToolCallFormat(parse_hermes, write_hermes))
register_tool_call_format("json_list", ToolCallFormat(parse_hermes, write_json_list))


def function_tool(name: str, description: str, arg: str, arg_description: str) -> dict:
    """An OpenAI-style tool schema with one required string argument ``arg``."""
    return tool_schema(name, description, {
        "type": "object", "required": [arg],
        "properties": {arg: {"type": "string", "description": arg_description}}})


def tool_schema(name: str, description: str, parameters: dict) -> dict:
    """An OpenAI-style tool schema: ``parameters`` is a JSON schema of an object."""
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}


def _single_string(parameters: dict) -> str | None:
    """The argument of a schema whose only argument is a string (the payload is its value)."""
    props = parameters.get("properties", {})
    if len(props) == 1:
        (arg, spec), = props.items()
        if spec.get("type") in (None, "string"):
            return arg
    return None


class ChatTemplateFormat:
    """``protocol.format: chat_template`` for one tokenizer (see the module docstring)."""

    name = "chat_template"

    def __init__(self, tokenizer: Any, tool_call_format: str = "hermes",
                 chat_template: str | None = None):
        self.template = chat_template
        if not (chat_template or getattr(tokenizer, "chat_template", None)):
            raise ValueError("protocol.format: chat_template needs a tokenizer with a chat "
                             f"template; {getattr(tokenizer, 'name_or_path', '') or 'this one'}"
                             " has none (use protocol.format: markup)")
        calls = get_tool_call_format(tool_call_format)
        self.tokenizer, self.tool_call_format = tokenizer, tool_call_format
        self.parser, self.write_call = calls.parse, calls.write
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self.end_text, self.end_id = self._turn_end()
        self._check_append_only()
        self._check_renders_tools()

    def clean(self, text: object) -> str:
        """``text`` without the tokenizer's added tokens (outside text cannot forge turns)."""
        return self._added.sub("", str(text)) if self._added else str(text)

    def render(self, messages: list[dict], tools: list[dict] | None, gen: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=gen, tokenize=False,
                chat_template=self.template)
        except Exception as err:  # jinja errors: name the template, not the traceback
            raise ValueError(f"protocol.format: chat_template: the tokenizer's chat template "
                             f"failed to render {[m['role'] for m in messages]}: "
                             f"{type(err).__name__}: {err}") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _turn_end(self) -> tuple[str, int]:
        """The token that ends an assistant turn: the first one the template writes after
        an assistant message's content (``<|im_end|>`` in ChatML); it must be an added
        token of the tokenizer."""
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": _SENTINEL}]
        text = self.render(probe, None, gen=False)
        tail = text[text.rfind(_SENTINEL) + len(_SENTINEL):] if _SENTINEL in text else ""
        ids = self.encode(tail)
        token = self.tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
        if token is None or token not in self.tokenizer.get_added_vocab() \
                or not tail.startswith(token):
            raise ValueError("protocol.format: chat_template: the chat template writes "
                             f"{tail[:40]!r} after an assistant turn, not an added token; "
                             "the end of a turn cannot be told (use protocol.format: markup)")
        return token, ids[0]

    def _check_renders_tools(self) -> None:
        """Refuse a template that drops ``tools=``: the planner would be told of no agent
        to delegate to, and a sub-agent of no tool."""
        probe = function_tool("mgrpo_probe_tool", "mgrpo-probe-description", "input", "text")
        text = self.render([{"role": "system", "content": "s"},
                            {"role": "user", "content": "u"}], [probe], gen=True)
        if "mgrpo_probe_tool" not in text:
            raise ValueError("protocol.format: chat_template: the chat template ignores "
                             "tools= (the agents would see no tools); set protocol."
                             "chat_template: chatml_tools (ChatML with tools) or protocol."
                             "chat_template_path: a Jinja file that renders them")

    def _check_append_only(self) -> None:
        """Refuse a template that renders an earlier turn differently once a later one is
        added (the sampled ids would not be the conversation's rendering)."""
        tools = [function_tool("probe", "a probe", "input", "text")]
        dialogue = _ChatDialogue(self, [{"role": "system", "content": "s"},
                                        {"role": "user", "content": "u"}], tools)
        dialogue.start_ids()
        dialogue.reply_ids(f"x{self.end_text}", "probe", "y")

    def planner(self, question: str, cards: Sequence[AgentCard]) -> _ChatDialogue:
        system = (PROMPTS / "chat_planner_system.txt").read_text(encoding="utf-8").strip()
        tools = [function_tool(c.name, self.clean(c.description), "task",
                               "what the agent should do") for c in cards]
        return _ChatDialogue(self, [{"role": "system", "content": system},
                                    {"role": "user", "content": self.clean(question)}],
                             tools, planner=True)

    def subagent(self, role: str, task: str, tool: Any = None,
                 description: str = "") -> _ChatDialogue:
        tool_name = getattr(tool, "name", None) or role
        tool_doc = getattr(tool, "description", None) or f"the {tool_name} tool"
        system = (PROMPTS / "chat_subagent_system.txt").read_text(encoding="utf-8").strip()
        system = system.format(role=role, description=self.clean(description or role),
                               tool=tool_name)
        parameters = getattr(tool, "parameters", None)  # a function tool's own arguments
        schema = (tool_schema(tool_name, self.clean(tool_doc), parameters) if parameters
                  else function_tool(tool_name, self.clean(tool_doc), "input",
                                     "the tool's input"))
        return _ChatDialogue(self, [{"role": "system", "content": system},
                                    {"role": "user", "content": self.clean(task)}],
                             [schema], planner=False)


class _ChatDialogue:
    """One conversation: its messages so far and the text the template rendered for them."""

    def __init__(self, fmt: ChatTemplateFormat, messages: list[dict], tools: list[dict],
                 planner: bool = True):
        self.fmt, self.messages, self.tools, self.planner = fmt, messages, tools, planner
        self.stop_ids = [fmt.end_id]
        self._rendered = ""

    def start_ids(self) -> list[int]:
        return self.fmt.encode(self.start_text())

    def start_text(self) -> str:
        """The prompt: the conversation so far with the generation prompt."""
        self._rendered = self.fmt.render(self.messages, self.tools, gen=True)
        return self._rendered

    def _split(self, text: str) -> tuple[str, bool]:
        end = self.fmt.end_text
        return (text[: -len(end)], True) if text.endswith(end) else (text, False)

    def reply_ids(self, turn_text: str, name: str, content: str) -> list[int]:
        return self.fmt.encode(self.reply_text(turn_text, name, content))

    def reply_text(self, turn_text: str, name: str, content: str) -> str:
        """What the template adds after the turn ``turn_text`` for the tool message
        ``content`` (from ``name``), up to the next generation prompt."""
        body, ended = self._split(turn_text)
        turn = {"role": "assistant", "content": body}
        closed = self.fmt.render(self.messages + [turn], self.tools, gen=False)
        if not closed.startswith(self._rendered):
            raise ValueError("protocol.format: chat_template: the chat template renders the "
                             "conversation differently once a turn is added (it is not "
                             "append-only); use protocol.format: markup")
        cut = closed.rfind(self.fmt.end_text) + (len(self.fmt.end_text) if ended else 0)
        self.messages += [turn, {"role": "tool", "name": name,
                                 "content": self.fmt.clean(content)}]
        rendered = self.fmt.render(self.messages, self.tools, gen=True)
        if rendered[:cut] != closed[:cut]:
            raise ValueError("protocol.format: chat_template: the chat template renders a "
                             "turn differently once a tool message follows it (it is not "
                             "append-only); use protocol.format: markup")
        self._rendered = rendered
        return rendered[cut:]

    def parse(self, text: str) -> PlannerAction | SubagentAction:
        invalid = PlannerAction if self.planner else SubagentAction
        body, ended = self._split(text)
        if not ended:
            return invalid("invalid", error=f"turn does not end with {self.fmt.end_text!r} "
                           f"(cut at max_new_tokens?); got {text[-80:]!r}")
        parsed = self.fmt.parser(body)
        if isinstance(parsed, str):
            return invalid("invalid", error=parsed)
        calls, outside = parsed
        if len(calls) > 1:
            return invalid("invalid", error=f"{len(calls)} tool calls in one turn; one per "
                           "turn")
        if not calls:
            final = body.strip()
            if not final:
                return invalid("invalid", error="empty turn: neither a tool call nor text")
            return (PlannerAction("answer", answer=final) if self.planner
                    else SubagentAction("return", payload=final))
        (name, args), = calls
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}
        if name not in schemas:
            return invalid("invalid", error=f"unknown tool {name!r}; callable: "
                           f"{list(schemas)}")
        arg = _single_string(schemas[name])
        if arg is None:  # a function tool of other arguments: they go to it as JSON
            return self._arguments_call(name, args, schemas[name])
        value = args.get(arg)
        if set(args) != {arg} or not isinstance(value, str) or not value.strip():
            return invalid("invalid", error=f"tool {name!r} takes one non-empty string "
                           f"argument {arg!r}; got {json.dumps(args)[:80]}")
        if self.planner:
            return PlannerAction("call", agent=name, task=value.strip())
        return SubagentAction("tool", payload=value.strip())

    def _arguments_call(self, name: str, args: dict, parameters: dict) -> SubagentAction:
        """A call of a tool whose arguments are not one string: their names checked against
        its schema, the payload their JSON (the tool reads it back)."""
        props, required = parameters.get("properties", {}), parameters.get("required", [])
        unknown = sorted(set(args) - set(props))
        missing = sorted(set(required) - set(args))
        if unknown or missing:
            return SubagentAction("invalid", error=f"tool {name!r} takes {sorted(props)} "
                                  f"(required {sorted(required)}); got "
                                  f"{json.dumps(args)[:80]}")
        if len(props) == 1:
            return SubagentAction("tool", payload=json.dumps(next(iter(args.values()))))
        return SubagentAction("tool", payload=json.dumps(args))
