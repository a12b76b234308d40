from __future__ import annotations

import json

import pytest
import torch

from mgrpo.models.sft import SFTConfig, encode_segments, load_sft_jsonl, train_sft


def _examples(n=24):
    out = []
    for i in range(n):
        a, b = i % 7, (i * 3) % 11
        out.append({"agent": "coder", "segments": [
            {"text": f"<|task|>add {a} and {b}<|coder|>", "train": False},
            {"text": f"<tool>print({a} + {b})</tool>", "train": True},
            {"text": f"<obs>{a + b}</obs>", "train": False},
            {"text": f"<return>{a + b}</return><|end|>", "train": True}]})
    out.append({"agent": "planner", "segments": [{"text": "<|planner|>x", "train": True}]})
    return out


def test_encode_segments_concatenates_separately_tokenised_segments(tiny):
    _, tok = tiny
    segments = _examples(1)[0]["segments"]
    ids, mask = encode_segments(tok, segments)
    expected_ids, expected_mask = [], []
    for seg in segments:
        seg_ids = tok(seg["text"], add_special_tokens=False)["input_ids"]
        expected_ids += seg_ids
        expected_mask += [int(seg["train"])] * len(seg_ids)
    assert ids == expected_ids and mask == expected_mask
    tool = tok("<tool>print(0 + 0)</tool>", add_special_tokens=False)["input_ids"]
    assert sum(mask) == len(tool) + len(tok("<return>0</return><|end|>",
                                            add_special_tokens=False)["input_ids"])


def test_load_sft_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_examples(1)[0]) + "\n\n" + '{"agent": "x"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:3"):
        load_sft_jsonl(path)
    path.write_text(json.dumps(_examples(1)[0]) + "\n")
    assert load_sft_jsonl(path)[0].agent == "coder"


def test_sft_lowers_loss_and_changes_every_weight(tiny):
    model, tok = tiny
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = SFTConfig(steps=30, batch_size=8, micro_batch_size=8, lr=3e-3, warmup_steps=3,
                       eval_fraction=0.2, eval_every=10, agent="coder")
    metrics = train_sft(model, tok, _examples(), config)
    assert metrics["examples"] == 24  # the planner example is filtered out
    assert len(metrics["train_loss"]) == 30
    first_eval, last_eval = metrics["eval_loss"][0][1], metrics["eval_loss"][-1][1]
    assert [s for s, _ in metrics["eval_loss"]] == [0, 10, 20, 30]
    assert last_eval < 0.6 * first_eval, metrics["eval_loss"]
    assert sum(metrics["train_loss"][-5:]) < sum(metrics["train_loss"][:5])
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, unchanged


def test_no_trainable_tokens_is_an_error(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="no SFT example with trainable tokens"):
        train_sft(model, tok, _examples(), SFTConfig(steps=1, agent="searcher"))


def test_a_named_warm_start_logs_a_line_per_evaluation(tiny, capsys, monkeypatch):
    """`mgrpo demo`'s warm start said nothing for 25 minutes when stderr was not a terminal:
    now each evaluation (step 0, every eval_every steps, the last) is a log line."""
    import re

    model, tok = tiny
    monkeypatch.delenv("MGRPO_QUIET", raising=False)
    config = SFTConfig(steps=4, batch_size=4, micro_batch_size=4, eval_fraction=0.2,
                       eval_every=2, agent="coder")
    metrics = train_sft(model, tok, _examples(), config, log_name="coder")
    lines = capsys.readouterr().err.splitlines()
    pattern = r"warm start coder \| step (\d)/4 \|( loss=[\d.e-]+ \|)? eval_loss=([\d.e-]+) \| "
    found = [re.match(pattern, line) for line in lines]
    assert [m[1] for m in found if m] == ["0", "2", "4"], lines
    assert [float(m[3]) for m in found if m] == pytest.approx(
        [loss for _, loss in metrics["eval_loss"]], rel=1e-3)
    train_sft(model, tok, _examples(), config)  # no name: no lines
    assert "warm start" not in capsys.readouterr().err
