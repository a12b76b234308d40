"""Container shell of the planner's REST API (``mgrpo serve planner``): the library's
:func:`mgrpo.services.entrypoints.serve_api`."""

from __future__ import annotations

from mgrpo.services.entrypoints import serve_api as main

__all__ = ["main"]
