"""Container shell of a planner worker (``mgrpo serve planner-worker``): episodes from
``planner.episodes`` in batches, delegations over the bus; the library's
:func:`mgrpo.services.entrypoints.serve_planner_worker`."""

from __future__ import annotations

from mgrpo.services.entrypoints import serve_planner_worker as main

__all__ = ["main"]
