"""The scripted experts' demonstrations in a model's own chat template, with native tool calls.

:func:`chat_records` turns one expert episode (:class:`~mgrpo.envs.experts.EpisodeTranscript`,
played in the agent protocol's markup) into SFT records of the same shape as the markup ones
(``{"agent": ..., "segments": [{"text": ..., "train": ...}]}``), each context rendered as a
rollout renders it (:class:`~mgrpo.envs.chat_format.ChatTemplateFormat`): the planner's prompt
with one tool per sub-agent card, each delegation or tool input as a call in the format's
``write_call`` form followed by the template's end-of-turn token (``train: true``), each
result as the template's rendering of a ``tool`` message (``train: false``), the answer or
returned result as plain text and the end-of-turn token (``train: true``). SFT on these
records therefore sees token for token the contexts RL samples in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mgrpo import protocol_tokens as T
from mgrpo.envs import protocol as P
from mgrpo.envs.experts import AgentTranscript, EpisodeTranscript


def _inner(text: str, open_tag: str, close_tag: str) -> str:
    return text[len(open_tag): -len(close_tag)] if text.startswith(open_tag) else text


def _record(transcript: AgentTranscript, dialogue, fmt, tool_name: str | None) -> dict:
    segments = [{"text": dialogue.start_text(), "train": False}]
    turn, callee = "", ""
    for segment in transcript.segments[1:]:
        text = segment.text
        if segment.train:
            if transcript.agent == "planner":
                action = P.parse_planner_turn(text)
                body = (fmt.write_call(action.agent, {"task": action.task})
                        if action.kind == "call" else action.answer)
                callee = action.agent or ""
            else:
                action = P.parse_subagent_turn(text)
                body = (fmt.write_call(tool_name, {"input": action.payload})
                        if action.kind == "tool" else action.payload)
                callee = tool_name or ""
            if action.kind == "invalid":
                raise ValueError(f"an expert turn does not parse: {text[:80]!r}")
            turn = body + fmt.end_text
            segments.append({"text": turn, "train": True})
        else:
            content = (_inner(text, T.RET_OPEN, T.RET_CLOSE) if transcript.agent == "planner"
                       else _inner(text, T.OBS_OPEN, T.OBS_CLOSE))
            segments.append({"text": dialogue.reply_text(turn, callee, content),
                             "train": False})
    return {"agent": transcript.agent, "segments": segments}


def chat_records(episode: EpisodeTranscript, question: str, fmt,
                 cards: Sequence[P.AgentCard], tools: Mapping[str, object]) -> list[dict]:
    """The planner's record, then each sub-agent invocation's, rendered by ``fmt`` (a
    ``chat_template`` turn format); ``cards``: the planner's sub-agents as a run shows them,
    ``tools``: role -> tool (its ``name`` and ``description`` go into the sub-agent's
    prompt, as in a rollout)."""
    descriptions = {card.name: card.description for card in cards}
    records = [_record(episode.planner, fmt.planner(question, cards), fmt, None)]
    for sub in episode.subagents:
        tool = tools.get(sub.agent)
        dialogue = fmt.subagent(sub.agent, sub.task or "", tool,
                                descriptions.get(sub.agent, sub.agent))
        records.append(_record(sub, dialogue, fmt, getattr(tool, "name", None) or sub.agent))
    return records
