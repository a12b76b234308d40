"""Tools the sub-agents call: a registry plus ``search`` (BM25) and ``python`` (sandboxed)."""

from mgrpo.tools.registry import (
    PROVIDED,
    ROLE_TOOLS,
    Tool,
    build_configured_tool,
    build_tool,
    check_tool,
    get_tool,
    register_tool,
    tool_names,
)

__all__ = ["PROVIDED", "ROLE_TOOLS", "Tool", "build_configured_tool", "build_tool",
           "check_tool", "get_tool", "register_tool", "tool_names",
           "SearchTool", "PythonTool"]


def __getattr__(name: str):
    # SearchTool imports bm25s; load it only when asked for.
    if name == "SearchTool":
        # here, not at the top: an import circle through mgrpo.tools.search
        from mgrpo.tools.search import SearchTool

        return SearchTool
    if name == "PythonTool":
        # here, not at the top: an import circle through mgrpo.tools.python
        from mgrpo.tools.python import PythonTool

        return PythonTool
    raise AttributeError(f"module 'mgrpo.tools' has no attribute {name!r}")
