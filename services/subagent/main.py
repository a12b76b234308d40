"""Container shell of one tool sub-agent (``mgrpo serve subagent --name N --tool T --model
PATH``): the library's :func:`mgrpo.services.entrypoints.serve_subagent`."""

from __future__ import annotations

from mgrpo.services.entrypoints import serve_subagent as main

__all__ = ["main"]
