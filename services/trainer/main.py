"""Container shell of one model's trainer (``mgrpo serve trainer --model M``), one rank of
it under ``torchrun``: the library's :func:`mgrpo.services.entrypoints.serve_trainer`."""

from __future__ import annotations

from mgrpo.services.entrypoints import serve_trainer as main

__all__ = ["main"]
