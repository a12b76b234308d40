"""Container shell of the tool-sandbox service (``mgrpo serve sandbox``): the library's app,
:func:`mgrpo.sandbox.app.create_app`."""

from __future__ import annotations

from mgrpo.sandbox.app import create_app

__all__ = ["create_app"]
