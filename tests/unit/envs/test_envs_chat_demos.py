"""The experts' demonstrations in a model's chat template with native tool calls: each record
is the conversation a rollout renders (its train segments parse back to the expert's actions,
its text is the template's rendering of the whole conversation), for both call forms."""

from __future__ import annotations

import json

import pytest
from chat_tokenizer import chat_tokenizer

from mgrpo.envs.demos import write_demos
from mgrpo.envs.experts import ExpertErrors
from mgrpo.envs.protocol import DEFAULT_AGENTS
from mgrpo.envs.turn_formats import build_turn_format
from mgrpo.models.sft import encode_segments


@pytest.mark.parametrize("call_format", ["hermes", "json_list"])
def test_chat_demos_are_the_rollout_rendering(small_bench, local_tools, tmp_path, call_format):
    tok = chat_tokenizer()
    fmt = build_turn_format("chat_template", tok, call_format)
    summary = write_demos(small_bench, tmp_path, local_tools, ExpertErrors(), n=12,
                          chat=(fmt, list(DEFAULT_AGENTS)))
    assert summary["format"] == "chat_template" and summary["records"]["planner"] == 12
    checked = 0
    for agent in ("planner", "searcher", "coder"):
        for line in (tmp_path / f"{agent}.jsonl").read_text().splitlines():
            record = json.loads(line)
            segments = record["segments"]
            assert record["agent"] == agent and not segments[0]["train"]
            user = segments[0]["text"].split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
            dialogue = (fmt.planner(user, list(DEFAULT_AGENTS)) if agent == "planner" else
                        fmt.subagent(agent, user, local_tools[agent],
                                     {c.name: c.description for c in DEFAULT_AGENTS}[agent]))
            assert dialogue.start_text() == segments[0]["text"]
            trains = [s["text"] for s in segments if s["train"]]
            actions = [dialogue.parse(t) for t in trains]
            assert all(a.kind != "invalid" for a in actions)
            assert actions[-1].kind in ("answer", "return")
            assert all(a.kind in ("call", "tool") for a in actions[:-1])
            if call_format == "json_list" and len(trains) > 1:
                assert trains[0].startswith("<tool_call>[{")
            ids, mask = encode_segments(tok, segments)
            assert sum(mask) == sum(len(tok.encode(t, add_special_tokens=False))
                                    for t in trains)
            checked += 1
    assert checked > 12
