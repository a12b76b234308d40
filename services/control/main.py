"""Container shell of the control-plane Celery worker (``mgrpo serve control``): pruning,
dead-letter replays and round commands; the library's
:func:`mgrpo.services.entrypoints.serve_control`."""

from __future__ import annotations

from mgrpo.services.entrypoints import serve_control as main

__all__ = ["main"]
