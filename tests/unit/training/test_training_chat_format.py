"""protocol.format: chat_template through the runners: the planner's and a sub-agent's
contexts are the tokenizer's chat-template rendering of their conversations, the loss mask
covers exactly the assistant turns, and the logprobs recorded at sampling equal a
teacher-forced pass over the stored ids (tiny model, CPU, float32)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from chat_tokenizer import chat_tokenizer, tiny_chat_model
from training_testkit import ScriptedEngine, fake_logprob, text_responder

from mgrpo.engines.base import GenerationRequest
from mgrpo.envs.chat_format import PROMPTS, ChatTemplateFormat, function_tool
from mgrpo.envs.protocol import DEFAULT_AGENTS
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeJob, EpisodeRunner, sampling_params
from mgrpo.training.subagents import LocalSubagentPool

END = "<|im_end|>"
QUESTION = "What is the population of Velmora?"
CALL = ('I will ask.<tool_call>\n{"name": "searcher", "arguments": {"task": "population of '
        'Velmora"}}\n</tool_call>')
SEARCH = '<tool_call>\n{"name": "search", "arguments": {"input": "Velmora"}}\n</tool_call>'
OBS = "Velmora is a city. Its population is 48210."


class FakeSearch:
    name, description = "search", "look up facts"

    def run(self, payload: str) -> str:
        return OBS


def _planner_turn(text: str, params) -> str:
    return (CALL if "<tool_response>" not in text else "48210") + END


def _searcher_turn(text: str, params) -> str:
    return (SEARCH if "<tool_response>" not in text else "48210") + END


def _play(planner_turn=_planner_turn):
    tok = chat_tokenizer()
    fmt = ChatTemplateFormat(tok)
    planner = AgentRuntime("planner", "planner", ScriptedEngine(
        tok, text_responder(tok, planner_turn)), tok, turn_format=fmt)
    searcher = AgentRuntime("searcher", "searcher", ScriptedEngine(
        tok, text_responder(tok, _searcher_turn)), tok, tool=FakeSearch(),
        description="look up facts", turn_format=fmt)
    sampling = SamplingConfig()
    runner = EpisodeRunner(planner, [DEFAULT_AGENTS[0]], sampling,
                           dispatch=LocalSubagentPool({"searcher": searcher}, sampling))
    question = SimpleNamespace(id="q1", question=QUESTION)
    return tok, runner.run([EpisodeJob(question, "r1", 0, seed=3)])[0]


def _rendered(tok, system: str, user: str, tool: dict, turns: list[str], result: str):
    """The template's own rendering of the conversation (the turn's trailing newline, which
    the template writes after the last <|im_end|>, is not part of an episode)."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user},
                {"role": "assistant", "content": turns[0]},
                {"role": "tool", "content": result},
                {"role": "assistant", "content": turns[1]}]
    text = tok.apply_chat_template(messages, tools=[tool], tokenize=False)
    assert text.endswith(END + "\n")
    return text[:-1]


def _assistant_mask(tok, text: str) -> tuple[list[int], list[int]]:
    """(ids, mask) of ``text``: mask 1 exactly on tokens inside an assistant turn's content
    and its closing <|im_end|>, found by character offsets, independently of the runner."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = [m.span(1) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)",
                                            text, flags=re.S)]
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    return enc["input_ids"], mask


def test_planner_context_is_the_template_rendering_and_masks_its_turns_only():
    tok, ep = _play()
    assert ep.answer == "48210" and ep.format_ok, ep.trace
    system = (PROMPTS / "chat_planner_system.txt").read_text().strip()
    tool = function_tool("searcher", "look up facts", "task", "what the agent should do")
    text = _rendered(tok, system, QUESTION, tool, [CALL, "48210"], "48210")
    ids, mask = _assistant_mask(tok, text)
    traj = ep.planner
    assert traj.input_ids == ids and traj.response_mask == mask
    assert sum(mask) == len(tok.encode(CALL + END + "48210" + END, add_special_tokens=False))
    assert traj.old_logprobs == [fake_logprob(i) if m else 0.0 for i, m in enumerate(mask)]


def test_subagent_context_is_the_template_rendering_and_masks_its_turns_only():
    tok, ep = _play()
    (traj,) = ep.subagents
    assert traj.format_ok and traj.result == "48210" and traj.subtask == "population of Velmora"
    system = (PROMPTS / "chat_subagent_system.txt").read_text().strip().format(
        role="searcher", description="look up facts", tool="search")
    tool = function_tool("search", "look up facts", "input", "the tool's input")
    text = _rendered(tok, system, "population of Velmora", tool, [SEARCH, "48210"], OBS)
    ids, mask = _assistant_mask(tok, text)
    assert traj.input_ids == ids and traj.response_mask == mask
    assert traj.old_logprobs == [fake_logprob(i) if m else 0.0 for i, m in enumerate(mask)]


def test_a_malformed_tool_call_ends_the_episode_with_its_reason_and_no_format_reward():
    bad = '<tool_call>{"name": "searcher", "arguments": {"task": }</tool_call>' + END
    tok, ep = _play(lambda text, params: bad)
    assert not ep.format_ok and ep.answer is None and ep.subagents == []
    assert "not JSON" in ep.trace[-1]["error"]
    assert ep.planner.response_mask.count(1) == len(tok.encode(bad, add_special_tokens=False))


@pytest.mark.parametrize("batch", [1, 3])
def test_sampled_logprobs_equal_a_teacher_forced_pass_over_the_rendered_turns(batch):
    """Three sampled turns per conversation, each followed by a tool message the template
    renders: the stored ids reproduce the sampler's logprobs within 1e-5."""
    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.models.logprobs import token_logprobs

    tok = chat_tokenizer()
    model = tiny_chat_model(tok)
    fmt = ChatTemplateFormat(tok)
    engine = TorchEngine(model, tok)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    dialogues = [fmt.planner(f"question {i}" * (i + 1), DEFAULT_AGENTS) for i in range(batch)]
    ctxs = [(d.start_ids(), [], []) for d in dialogues]
    for turn in range(3):
        requests = [GenerationRequest(list(ids), sampling_params(sampling, d.stop_ids, 10 * i
                                                                 + turn))
                    for i, (d, (ids, _, _)) in enumerate(zip(dialogues, ctxs, strict=True))]
        for (d, (ids, mask, logp)), out in zip(zip(dialogues, ctxs, strict=True),
                                               engine.generate(requests), strict=True):
            mask += [0] * (len(ids) - len(mask))
            logp += [0.0] * (len(ids) - len(logp))
            ids += out.completion_ids
            mask += [1] * len(out.completion_ids)
            logp += out.logprobs
            ids += d.reply_ids(out.text, "searcher", json.dumps({"turn": turn}))
    worst = 0.0
    with torch.no_grad():
        for ids, mask, logp in ctxs:
            ref = token_logprobs(model, torch.tensor([ids]))[0]
            picked = torch.tensor([m == 1 for m in mask] + [False] * (len(ids) - len(mask)))
            assert int(picked.sum()) == len([x for x in mask if x]) > 0
            worst = max(worst, (ref[picked] - torch.tensor(
                [lp for lp, m in zip(logp, mask, strict=True) if m])).abs().max().item())
    assert worst < 1e-5, worst


def test_run_config_takes_the_format_and_refuses_it_where_it_does_not_play(tmp_path):
    from training_testkit import run_config_dict

    from mgrpo.training.config import RunConfig

    base = run_config_dict(tmp_path, tmp_path / "m", tmp_path / "b")
    assert RunConfig(**base).protocol.format == "markup"
    cfg = RunConfig(**base, protocol={"format": "chat_template"})
    assert (cfg.protocol.format, cfg.protocol.tool_call_format) == ("chat_template", "hermes")
    for algorithm in ("grpo", "at_grpo"):
        with pytest.raises(ValueError, match=f"plays algorithm mgrpo .*; {algorithm} renders"):
            RunConfig(**{**base, "algorithm": algorithm}, protocol={"format": "chat_template"})
    with pytest.raises(ValueError, match="unknown tool_call_format 'mistral'"):
        RunConfig(**base, protocol={"format": "chat_template", "tool_call_format": "mistral"})
    with pytest.raises(ValueError, match="formt"):
        RunConfig(**base, protocol={"formt": "chat_template"})


def test_a_rounds_protocol_picks_the_format_of_the_services_runtime():
    from mgrpo.envs.turn_formats import MarkupFormat
    from mgrpo.training.config import ProtocolConfig
    from mgrpo.training.episodes import with_protocol

    tok = chat_tokenizer()
    runtime = AgentRuntime("planner", "planner", None, tok)
    assert isinstance(runtime.format(), MarkupFormat)
    assert with_protocol(runtime, ProtocolConfig()) is runtime
    chat = with_protocol(runtime, ProtocolConfig(format="chat_template"))
    assert isinstance(chat.turn_format, ChatTemplateFormat) and chat.tokenizer is tok
    assert with_protocol(chat, ProtocolConfig(format="chat_template")) is chat


def test_an_embedded_round_plays_the_chat_template(tmp_path, bench_dir, tiny_dir):
    """`mgrpo train`'s loop with protocol.format: chat_template: the stored trajectories are
    chat-template conversations; a tokenizer whose template is not append-only (the tiny
    models' markup template) is refused before anything runs."""
    from training_testkit import run_config_dict

    from mgrpo.store import Store
    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import run_training

    tok = chat_tokenizer()
    model_dir = tmp_path / "chat-model"
    tiny_chat_model(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    chat = {"protocol": {"format": "chat_template"}, "stages": [{"stage": 1, "rounds": 1}],
            "eval_questions": 1}
    cfg = RunConfig.model_validate(run_config_dict(tmp_path, model_dir, bench_dir, **chat))
    assert run_training(cfg, progress=False).rounds == 1
    store = Store(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    (round_,) = store.list_rounds("t")
    planner = store.round_trajectories(round_.round_id, "planner")
    assert len(planner) == cfg.queries_per_round * cfg.k
    for traj in planner:
        prompt = traj.input_ids[:traj.response_mask.index(1)]
        assert tok.decode(prompt).startswith("<|im_start|>system\nYou are the planner")
        assert tok.decode(prompt).endswith("<|im_end|>\n<|im_start|>assistant\n")
    markup = RunConfig.model_validate(run_config_dict(tmp_path / "m", tiny_dir, bench_dir,
                                                      **chat))
    with pytest.raises(ValueError, match="^protocol.format: chat_template: .*markup$"):
        run_training(markup, progress=False)


def test_teacher_transcripts_are_chat_conversations_that_sft_encodes_whole(
        tmp_path, bench, bench_dir):
    """`mgrpo data transcripts` with protocol.format: chat_template: each kept trajectory is
    a chat-template conversation; its segments, encoded the way `mgrpo sft` encodes them,
    give the ids of the whole conversation's text, the loss on the assistant turns."""
    from training_testkit import run_config_dict

    from mgrpo.experiments.transcripts import write_transcripts
    from mgrpo.models.sft import encode_segments
    from mgrpo.training.config import RunConfig

    tok = chat_tokenizer()
    gold = {q.question: q.answer for q in bench.questions("train")}

    def turn(text: str, params) -> str:
        if "You are the planner" not in text:  # a sub-agent: search once, then return
            call = '<tool_call>{"name": "search", "arguments": {"input": "x"}}</tool_call>'
            return ("found" if "<tool_response>" in text else call) + END
        if "<tool_response>" not in text:
            return '<tool_call>{"name": "searcher", "arguments": {"task": "x"}}</tool_call>' + END
        return next(a for q, a in gold.items() if q in text) + END

    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tmp_path, bench_dir, protocol={"format": "chat_template"}))
    summary = write_transcripts(cfg, bench, ScriptedEngine(tok, text_responder(tok, turn)),
                                tok, tmp_path / "out", n=2, samples=1)
    assert summary["kept"] == 2 and summary["records"] == {"planner": 2, "searcher": 2}
    for agent in ("planner", "searcher"):
        for line in (tmp_path / "out" / f"{agent}.jsonl").read_text().splitlines():
            segments = json.loads(line)["segments"]
            ids, mask = encode_segments(tok, segments)
            text = tok.decode(ids)
            assert text.startswith("<|im_start|>system\n") and "<tool_response>" in text
            assert [s["train"] for s in segments] == [False, True, False, True]
            assert all(s["text"].endswith(END) for s in segments if s["train"])
            assert ids == tok.encode("".join(s["text"] for s in segments),
                                     add_special_tokens=False)
            turns = [tok.encode(s["text"], add_special_tokens=False) for s in segments]
            assert mask == [int(s["train"]) for s, t in zip(segments, turns, strict=True)
                            for _ in t]
