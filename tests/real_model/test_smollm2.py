"""SmolLM2-135M-Instruct, imported offline (``make real-model``), through the chat protocol:
the planner's prompt lists its tools, an expert call in the model's own form parses back and
its result renders as a tool turn, the model's own greedy turn parses (a call or an answer,
or an invalid action with its reason), and one update of a LoRA adapter changes the adapter
and leaves every base weight as it was.

Heavy: skipped when the folder is missing, failed under ``CI=true`` (``make test`` runs
``make real-model`` first)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.envs.protocol import DEFAULT_AGENTS
from mgrpo.envs.turn_formats import build_turn_format
from mgrpo.models.loading import load_model
from mgrpo.models.lora import LoraSpec, apply_lora, trainable_parameters
from mgrpo.models.sft import SFTConfig, train_sft

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

FOLDER = Path(os.environ.get("MGRPO_REAL_MODEL", Path(__file__).resolve().parents[2]
                             / "runs" / "models" / "smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def smollm2():
    if not (FOLDER / "config.json").is_file():
        message = f"{FOLDER} is missing: run `make real-model`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return load_model(FOLDER)


def test_chat_tool_call_round_trip(smollm2):
    model, tok = smollm2
    assert model.num_parameters() == 134_515_008 and len(tok) == 49_152
    fmt = build_turn_format("chat_template", tok, "json_list")
    cards = [c for c in DEFAULT_AGENTS if c.name == "searcher"]
    dialogue = fmt.planner("What is the population of Kelstad?", cards)
    prompt = dialogue.start_text()
    assert '"name": "searcher"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    call = fmt.write_call("searcher", {"task": "population of Kelstad"}) + fmt.end_text
    action = dialogue.parse(call)
    assert (action.kind, action.agent, action.task) == ("call", "searcher",
                                                       "population of Kelstad")
    reply = dialogue.reply_text(call, "searcher", "47238")
    assert reply == "\n<|im_start|>tool\n47238<|im_end|>\n<|im_start|>assistant\n"
    assert dialogue.parse("47238" + fmt.end_text).answer == "47238"

    engine = TorchEngine(model, tok)
    out, = engine.generate([GenerationRequest(
        prompt_ids=fmt.planner("What is 12 + 7?", cards).start_ids(),
        params=SamplingParams(temperature=0.0, max_new_tokens=48,
                              stop_token_ids=dialogue.stop_ids))])
    assert out.completion_ids and len(out.logprobs) == len(out.completion_ids)
    turn = fmt.planner("What is 12 + 7?", cards).parse(out.text)
    assert turn.kind in ("call", "answer", "invalid")
    if turn.kind == "invalid":
        assert turn.error


def test_one_lora_update_changes_the_adapter_only(smollm2):
    base_model, tok = load_model(FOLDER)
    model = apply_lora(base_model, LoraSpec(r=8, alpha=16))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fmt = build_turn_format("chat_template", tok, "json_list")
    dialogue = fmt.planner("What is the population of Kelstad?",
                           [c for c in DEFAULT_AGENTS if c.name == "searcher"])
    call = fmt.write_call("searcher", {"task": "population of Kelstad"}) + fmt.end_text
    record = {"agent": "planner", "segments": [
        {"text": dialogue.start_text(), "train": False}, {"text": call, "train": True}]}
    train_sft(model, tok, [record] * 2, SFTConfig(steps=1, batch_size=1, micro_batch_size=1,
                                                  lr=1e-3, warmup_steps=0,
                                                  eval_fraction=0.0))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    assert len(trainable_parameters(model)) == len(trained)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trained
    assert any("lora_B" in n for n in changed)
