"""How an agent's context is rendered and its turns parsed: the run config's ``protocol.format``.

A :class:`TurnFormat` makes one :class:`Dialogue` per agent context (a planner episode, one
sub-agent invocation). The runners (``mgrpo.training.episodes``, ``mgrpo.training.subagents``)
grow the context from the dialogue's token ids: ``start_ids`` (the prompt, mask 0), the
sampled ids of each turn (mask 1, generation stops at ``stop_ids``), and after a delegation or
a tool call ``reply_ids`` (the result or observation, mask 0). ``parse`` turns a turn's text
into a :class:`~mgrpo.envs.protocol.PlannerAction` or :class:`~mgrpo.envs.protocol.SubagentAction`.

Formats (:data:`TURN_FORMATS`, a :class:`~mgrpo.registry.Registry`: ``register_turn_format``,
``get_turn_format``, ``turn_format_names``; :func:`build_turn_format` builds one):

- ``markup``: the agent protocol of ``mgrpo.envs.protocol`` (its special tokens).
- ``chat_template``: the tokenizer's own chat template and tool-call format
  (``mgrpo.envs.chat_format``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from mgrpo import protocol_tokens as T
from mgrpo.envs import protocol as P
from mgrpo.envs.chat_format import ChatTemplateFormat
from mgrpo.registry import Registry


class Dialogue(Protocol):
    stop_ids: list[int]

    def start_ids(self) -> list[int]: ...

    def parse(self, text: str) -> Any: ...

    def reply_ids(self, turn_text: str, name: str, content: str) -> list[int]:
        """Ids appended after the turn ``turn_text``: ``content`` (a sub-agent's result or a
        tool's output) answering the call to ``name``."""
        ...


class TurnFormat(Protocol):
    name: str
    tool_call_format: str

    def planner(self, question: str, cards: Sequence[P.AgentCard]) -> Dialogue: ...

    def subagent(self, role: str, task: str, tool: Any = None,
                 description: str = "") -> Dialogue: ...


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


class _MarkupDialogue:
    def __init__(self, tokenizer: Any, header: str, stops: Sequence[str], planner: bool,
                 callees: Sequence[str] = ()):
        self.tokenizer, self.header, self.planner = tokenizer, header, planner
        self.callees = tuple(callees)  # a delegating sub-agent's callable sub-agents
        self.stop_ids = [tokenizer.convert_tokens_to_ids(m) for m in stops]

    def start_ids(self) -> list[int]:
        return _encode(self.tokenizer, self.header)

    def parse(self, text: str) -> Any:
        if self.planner:
            return P.parse_planner_turn(text)
        return P.parse_subagent_turn(text, self.callees)

    def reply_ids(self, turn_text: str, name: str, content: str) -> list[int]:
        delegated = self.planner or (self.callees and name in self.callees)
        render = P.render_ret if delegated else P.render_obs
        return _encode(self.tokenizer, render(content))


class MarkupFormat:
    """The agent protocol's markup (``mgrpo.envs.protocol``)."""

    name = "markup"

    def __init__(self, tokenizer: Any, tool_call_format: str = "hermes",
                 chat_template: str | None = None):
        self.tokenizer, self.tool_call_format = tokenizer, tool_call_format

    def planner(self, question: str, cards: Sequence[P.AgentCard]) -> Dialogue:
        return _MarkupDialogue(self.tokenizer, P.planner_header(question, cards),
                               T.PLANNER_STOPS, planner=True)

    def subagent(self, role: str, task: str, tool: Any = None,
                 description: str = "") -> Dialogue:
        return _MarkupDialogue(self.tokenizer, P.subagent_header(role, task),
                               T.SUBAGENT_STOPS, planner=False)

    def delegate(self, role: str, task: str, cards: Sequence[P.AgentCard]) -> Dialogue:
        """A sub-agent that may call the sub-agents of ``cards`` (a nested hierarchy)."""
        return _MarkupDialogue(self.tokenizer, P.delegate_header(role, task, cards),
                               T.DELEGATE_STOPS, planner=False,
                               callees=[c.name for c in cards])


def _chat_format(tokenizer: Any, tool_call_format: str = "hermes",
                 chat_template: str | None = None) -> TurnFormat:
    return ChatTemplateFormat(tokenizer, tool_call_format, chat_template)


# name -> factory(tokenizer, tool_call_format, chat_template) -> TurnFormat
TURN_FORMATS: Registry[Any] = Registry("turn format", hint="the run config's protocol.format")
register_turn_format = TURN_FORMATS.register
get_turn_format = TURN_FORMATS.get
turn_format_names = TURN_FORMATS.names
register_turn_format("markup", MarkupFormat)
register_turn_format("chat_template", _chat_format)


def build_turn_format(name: str, tokenizer: Any, tool_call_format: str = "hermes",
                      chat_template: str | None = None) -> TurnFormat:
    """The format ``name`` (``protocol.format``) for ``tokenizer``; refuses an unknown name,
    and ``chat_template`` for a tokenizer without a chat template (or one that drops
    ``tools=``), in one line. ``chat_template``: a template text replacing the tokenizer's."""
    return get_turn_format(name)(tokenizer, tool_call_format, chat_template)
