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
