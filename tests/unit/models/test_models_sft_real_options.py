"""`mgrpo sft` options for a real model: TRL's conversational lines with assistant-only loss,
bf16 autocast, gradient checkpointing (the same gradients), a log line every N steps, LoRA
merged into the written weights, and a learning rate that fits the model's size."""

from __future__ import annotations

import json

import pytest
import torch
from chat_tokenizer import chat_tokenizer, save_chat_model

from mgrpo.models.sft import (
    SFTConfig,
    collate,
    default_lr,
    encode_segments,
    load_sft_jsonl,
    masked_nll,
    messages_segments,
    train_sft,
)

CONVERSATION = [{"role": "system", "content": "You are the planner."},
                {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3 + 3?"},
                {"role": "assistant", "content": "6"}]


def test_messages_train_only_the_assistant_turns():
    tok = chat_tokenizer()
    segments = messages_segments(tok, CONVERSATION)
    assert "".join(s.text for s in segments) == tok.apply_chat_template(
        CONVERSATION, tokenize=False)
    assert [s.text for s in segments if s.train] == ["4<|im_end|>\n", "6<|im_end|>\n"]
    prompts = [s.text for s in segments if not s.train]
    assert prompts[-1].endswith("<|im_start|>assistant\n")


def test_a_messages_file_loads_with_the_tokenizer(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION, "agent": "planner"}) + "\n")
    example, = load_sft_jsonl(path, chat_tokenizer())
    assert example.agent == "planner" and sum(s.train for s in example.segments) == 2
    with pytest.raises(ValueError, match=":1: .*needs the model's tokenizer"):
        load_sft_jsonl(path)


def _batch(tok):
    examples = [messages_segments(tok, CONVERSATION[:3]), messages_segments(tok, CONVERSATION)]
    return collate([encode_segments(tok, e) for e in examples], tok.pad_token_id)


def _grads(model, batch, **kw):
    model.zero_grad()
    masked_nll(model, *batch, backward=True, **kw)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    from mgrpo.models.loading import load_model

    model, tok = load_model(save_chat_model(tmp_path / "m"))
    model.train()
    batch = _batch(tok)
    plain = _grads(model, batch)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    checkpointed = _grads(model, batch)
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-4, atol=1e-6)
    bf16 = _grads(model, batch, dtype="bfloat16")
    cosine = torch.nn.functional.cosine_similarity(
        torch.cat([g.flatten() for g in plain.values()]),
        torch.cat([g.flatten() for g in bf16.values()]), dim=0)
    assert cosine > 0.95


def test_bf16_sft_trains_and_logs_every_n_steps(tmp_path, capsys):
    from mgrpo.models.loading import load_model

    model, tok = load_model(save_chat_model(tmp_path / "m"))
    before = model.model.embed_tokens.weight.detach().clone()
    examples = [{"agent": "a", "segments": [s.model_dump() for s in
                                             messages_segments(tok, CONVERSATION)]}] * 8
    metrics = train_sft(model, tok, examples, SFTConfig(
        steps=6, batch_size=4, micro_batch_size=2, lr=1e-3, dtype="bfloat16",
        gradient_checkpointing=True, log_every=2, eval_fraction=0.0), log_name="t")
    assert metrics["train_loss"][-1] < metrics["train_loss"][0]
    assert not torch.equal(before, model.model.embed_tokens.weight)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "warm start t | step" in ln]
    assert [ln.split("|")[1].strip() for ln in lines if "s_per_step" in ln] == [
        "step 2/6", "step 4/6", "step 6/6"]


def test_default_lr_by_size():
    assert default_lr(1_000_000, False) == 1e-3
    assert default_lr(134_515_008, False) == 2e-5
    assert default_lr(134_515_008, True) == 2e-4


def test_cli_lora_sft_writes_merged_full_weights(tmp_path):
    from typer.testing import CliRunner

    from mgrpo.cli.main import app
    from mgrpo.models.loading import load_model

    folder = save_chat_model(tmp_path / "m")
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    result = CliRunner().invoke(app, ["sft", "--model", str(folder), "--data", str(data),
                                      "--out", str(tmp_path / "ckpt"), "--name", "p",
                                      "--steps", "3", "--batch-size", "2", "--lora-r", "4",
                                      "--lr", "1e-2", "--log-every", "1"])
    assert result.exit_code == 0, result.output
    base, _ = load_model(folder)
    tuned, _ = load_model(tmp_path / "ckpt" / "p" / "v000000")
    assert type(tuned).__name__ == type(base).__name__  # plain weights, no adapter
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base.state_dict()[q], tuned.state_dict()[q])
    assert torch.equal(base.state_dict()["model.embed_tokens.weight"],
                       tuned.state_dict()["model.embed_tokens.weight"])
