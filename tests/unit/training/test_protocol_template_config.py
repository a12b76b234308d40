"""``protocol.chat_template`` (a built-in name) and ``protocol.chat_template_path`` (a file,
relative to the config file): the replacing template's text, and refusals in one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mgrpo.models.chat_templates import BUILTIN
from mgrpo.training.config_yaml import resolve_paths
from mgrpo.training.run_sections import ProtocolConfig


def test_builtin_and_file_templates(tmp_path):
    assert ProtocolConfig().template_text() is None
    builtin = ProtocolConfig(format="chat_template", chat_template="chatml_tools")
    assert builtin.template_text() == BUILTIN["chatml_tools"].read_text()
    (tmp_path / "mine.jinja").write_text("{{ messages }}")
    data = resolve_paths({"protocol": {"format": "chat_template",
                                       "chat_template_path": "mine.jinja"}},
                         tmp_path / "run.yaml")
    assert ProtocolConfig(**data["protocol"]).template_text() == "{{ messages }}"


def test_unknown_or_double_templates_are_refused():
    with pytest.raises(ValidationError, match="unknown chat_template 'chatml'"):
        ProtocolConfig(chat_template="chatml")
    with pytest.raises(ValidationError, match="not both"):
        ProtocolConfig(chat_template="chatml_tools", chat_template_path="x.jinja")
    with pytest.raises(ValidationError, match="unknown tool_call_format"):
        ProtocolConfig(tool_call_format="pythonic")


def test_config_check_names_a_template_that_drops_tools(tmp_path):
    import sys
    from pathlib import Path

    import yaml

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from chat_tokenizer import SMOLLM2_TEMPLATE, save_chat_model

    from mgrpo.experiments.config_files import check_file
    from mgrpo.models.loading import load_tokenizer

    folder = save_chat_model(tmp_path / "model")
    tok = load_tokenizer(folder)
    tok.chat_template = SMOLLM2_TEMPLATE
    tok.save_pretrained(folder)
    models = {m: {"path": str(folder)} for m in ("planner", "searcher", "coder")}
    (tmp_path / "bench").mkdir()
    run = {"models": models, "out_dir": str(tmp_path / "out"), "bench_dir": "bench",
           "protocol": {"format": "chat_template"}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    _, problems = check_file(tmp_path / "run.yaml")
    assert len(problems) == 3 and all("ignores tools=" in p for p in problems)
    run["protocol"]["chat_template"] = "chatml_tools"
    (tmp_path / "fixed.yaml").write_text(yaml.safe_dump(run))
    assert check_file(tmp_path / "fixed.yaml") == ("run", [])
