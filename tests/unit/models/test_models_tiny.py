from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mgrpo.models import ModelLoadError, TinyModelConfig, init_tiny, load_model
from mgrpo.models.tiny import count_parameters
from mgrpo.protocol_tokens import EOS, PAD, SPECIAL_TOKENS


def test_every_protocol_marker_is_one_token(tiny):
    _, tok = tiny
    ids = set()
    for marker in SPECIAL_TOKENS:
        encoded = tok(marker, add_special_tokens=False)["input_ids"]
        assert len(encoded) == 1, (marker, encoded)
        ids.add(encoded[0])
    assert len(ids) == len(SPECIAL_TOKENS)  # distinct ids
    assert tok.pad_token == PAD and tok.eos_token == EOS
    assert tok.pad_token_id != tok.eos_token_id


def test_markers_inside_text_stay_single_and_decode_back(tiny):
    _, tok = tiny
    text = "<call>searcher|population of Velmora</call><ret>48210</ret>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<call>")
    assert tok.convert_tokens_to_ids("</call>") in ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_folder_loads_with_plain_auto_classes(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok)
    assert 1_000_000 <= count_parameters(model) <= 5_000_000
    chat = tok.apply_chat_template([{"role": "planner", "content": "hi"}], tokenize=False)
    assert chat == "<|planner|>hi<|end|>"


def test_same_config_corpus_seed_gives_identical_files(tmp_path):
    corpus = ["alpha beta gamma <call>x</call>"] * 20 + ["delta 12 + 30 = 42"] * 10
    config = TinyModelConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64, seed=3)
    a = init_tiny(tmp_path / "a", config, corpus)
    b = init_tiny(tmp_path / "b", config, corpus)
    c = init_tiny(tmp_path / "c", config.model_copy(update={"seed": 4}), corpus)
    assert json.loads((a / "tokenizer.json").read_text()) == \
        json.loads((b / "tokenizer.json").read_text())
    ma, mb, mc = (load_model(p)[0].state_dict() for p in (a, b, c))
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert not torch.equal(ma["model.embed_tokens.weight"], mc["model.embed_tokens.weight"])


def test_bad_head_config_is_rejected_with_the_rule():
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        TinyModelConfig(hidden_size=130, num_attention_heads=4)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        TinyModelConfig(num_attention_heads=4, num_key_value_heads=3)


def test_load_model_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="could not load"):
        load_model(tmp_path)


def test_auto_tokenizer_splits_text_exactly_like_the_trained_tokenizer(tiny_dir):
    """AutoTokenizer loads a qwen2 folder as Qwen2Tokenizer, which installs its own
    pre-tokenizer; the trained one must agree with it or SFT/RL ids would drift."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    for text in ["Hello  world 12345 café", "<call>searcher|x</call>\n\tok",
                 " what is 48210 + 3?", "<|task|>add<|coder|><tool>print(1)</tool>"]:
        assert auto(text, add_special_tokens=False)["input_ids"] == \
            raw.encode(text, add_special_tokens=False).ids, text
