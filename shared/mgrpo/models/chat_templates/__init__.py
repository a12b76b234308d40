"""Chat templates shipped with mgrpo, by name, and the rule that finds a template.

A run config's ``protocol.chat_template_path`` and ``mgrpo models import-gguf
--chat-template`` take a built-in name (:data:`BUILTIN`) or a path to a Jinja file; the
template replaces the tokenizer's own (TRL's ``chat_template_path``).

- ``chatml_tools``: ChatML with a tool block in the system turn and calls written as
  ``<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`` (SmolLM2-Instruct's
  function-calling form), for ChatML models whose own template drops ``tools=``.
"""

from __future__ import annotations

import functools
from pathlib import Path

HERE = Path(__file__).parent
BUILTIN = {path.stem: path for path in sorted(HERE.glob("*.jinja"))}


@functools.lru_cache(maxsize=32)
def resolve_chat_template(name_or_path: str | Path) -> str:
    """The template text of a built-in name or a Jinja file (read once per process: a run's
    workers resolve it for every batch of calls); ValueError naming both kinds when it is
    neither."""
    if str(name_or_path) in BUILTIN:
        return BUILTIN[str(name_or_path)].read_text(encoding="utf-8")
    path = Path(name_or_path)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise ValueError(f"chat template {str(name_or_path)!r} is neither a built-in template "
                     f"({sorted(BUILTIN)}) nor a file")
