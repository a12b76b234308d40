"""``mgrpo models import``: a model with its own tokenizer family and chat template (here a
Llama with a byte-level BPE and a ChatML template, built locally) gets the protocol markers as
single tokens, its embeddings resized, and loads and generates as an mgrpo model."""

from __future__ import annotations

import json

import pytest
import torch

from mgrpo import protocol_tokens as P

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def foreign_dir(tmp_path_factory):
    """A byte-level BPE (GPT-2 style, no protocol markers) + a tiny Llama, saved as HF."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = ["The capital of France is Paris.", "print(2 + 2)", "search the web for facts",
              "<call>searcher|x</call> <answer>4</answer>"] * 20
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.chat_template = CHATML
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id))
    folder = tmp_path_factory.mktemp("foreign")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_import_adds_the_markers_as_single_tokens_and_resizes(foreign_dir, tmp_path):
    from mgrpo.engines.base import GenerationRequest, SamplingParams
    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.models import load_model
    from mgrpo.models.importing import import_model, marker_problems, protocol_markers

    src_model, src_tok = load_model(foreign_dir)
    before = marker_problems(src_tok, protocol_markers())
    assert "<call>" in before and "<|planner|>" in before  # split by the byte-level BPE
    report = import_model(foreign_dir, tmp_path / "m", roles=("planner", "searcher", "coder",
                                                               "writer"))
    assert set(report["added"]) == set(before) | {"<|writer|>"}
    assert report["vocab_after"] == report["vocab_before"] + len(report["added"])
    assert report["embeddings"] == report["vocab_after"] and report["chat_template"]

    model, tok = load_model(tmp_path / "m")
    assert marker_problems(tok, protocol_markers(("planner", "writer"))) == {}
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert model.get_output_embeddings().weight.shape[0] == len(tok)
    # the old vocabulary, its special tokens and the old weights are unchanged
    assert tok.convert_tokens_to_ids("<|im_start|>") == src_tok.convert_tokens_to_ids(
        "<|im_start|>")
    assert tok.encode("Paris is a city") == src_tok.encode("Paris is a city")
    old = src_model.get_input_embeddings().weight
    assert torch.equal(model.get_input_embeddings().weight[:old.shape[0]], old)
    # new rows: each the mean of its text's pieces (test_new_markers_start_apart_...)
    assert tok.pad_token == P.PAD and tok.pad_token_id != tok.eos_token_id
    # its own chat template is kept
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # a protocol prompt encodes with one id per marker, and the engine generates from it
    prompt = tok.encode(f"{P.TASK}capital of France{P.ROLE_TOKEN.format(role='searcher')}",
                        add_special_tokens=False)
    assert prompt[0] == tok.convert_tokens_to_ids(P.TASK)
    out = TorchEngine(model, tok).generate([GenerationRequest(
        prompt, SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))])[0]
    assert 1 <= len(out.completion_ids) == len(out.logprobs) <= 4


def test_import_is_idempotent_and_refuses_a_non_empty_folder(foreign_dir, tmp_path):
    from mgrpo.models.importing import import_model

    import_model(foreign_dir, tmp_path / "a")
    again = import_model(tmp_path / "a", tmp_path / "b")
    assert again["added"] == [] and again["vocab_after"] == again["vocab_before"]
    with pytest.raises(FileExistsError, match="not empty"):
        import_model(foreign_dir, tmp_path / "a")


def test_cli_models_import(foreign_dir, tmp_path):
    from typer.testing import CliRunner

    from mgrpo.cli.models import app

    result = CliRunner().invoke(app, ["import", str(foreign_dir), "--out",
                                      str(tmp_path / "m"), "--roles", "planner,searcher"])
    assert result.exit_code == 0, result.output
    # the JSON report, after the weight-loading progress bars (\r, same line)
    report = json.loads(result.output[result.output.index('{"out"'):].splitlines()[0])
    assert "<call>" in report["added"] and "<|coder|>" in report["added"]  # builtin markers


def test_new_markers_start_apart_at_their_texts_pieces(foreign_dir, tmp_path):
    """Each added marker's row is the mean of its text's sub-token rows: distinct markers,
    not one shared point (a mean row for all gave cosine 1.0 and swapped markers at T=1)."""
    from mgrpo.models import load_model
    from mgrpo.models.importing import import_model

    src_model, src_tok = load_model(foreign_dir)
    report = import_model(foreign_dir, tmp_path / "out")
    model, tok = load_model(tmp_path / "out")
    table = model.get_input_embeddings().weight.detach()
    rows = torch.stack([table[tok.convert_tokens_to_ids(m)] for m in report["added"]])
    unit = torch.nn.functional.normalize(rows, dim=1)
    cosine = unit @ unit.T
    off_diagonal = cosine[~torch.eye(len(rows), dtype=torch.bool)]
    assert off_diagonal.max() < 0.999
    src_table = src_model.get_input_embeddings().weight.detach()
    call = P.CALL_OPEN
    expected = src_table[src_tok.encode(call, add_special_tokens=False)].mean(dim=0)
    torch.testing.assert_close(table[tok.convert_tokens_to_ids(call)], expected)
    out = model.get_output_embeddings().weight.detach()
    torch.testing.assert_close(
        out[tok.convert_tokens_to_ids(call)],
        src_model.get_output_embeddings().weight.detach()[
            src_tok.encode(call, add_special_tokens=False)].mean(dim=0))
