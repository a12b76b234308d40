"""How the ``mgrpo`` command reports an error: one line saying what is wrong, one hint.

A config typo or a missing model folder would otherwise print a ~40-line traceback whose last
line is the only useful one. :class:`ErrorReportingGroup` (the root command group) catches
every exception a command raises and prints ``error: ...`` plus a hint instead; ``--debug``
(or ``MGRPO_DEBUG=1``) lets the traceback through for a bug report.

What this module does NOT do: catch typer's own usage errors (bad option, missing argument):
typer already prints those as one line with ``--help`` as the hint.
"""

from __future__ import annotations

import os
import re

import typer
from typer.core import TyperGroup

DEBUG_HINT = "run with --debug (or MGRPO_DEBUG=1) for the traceback"


class UserError(Exception):
    """An error with a known cause: ``message`` says what is wrong, ``hint`` how to fix it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def debug_enabled() -> bool:
    return os.environ.get("MGRPO_DEBUG", "").lower() in ("1", "true", "yes")


def describe(exc: BaseException) -> tuple[str, str]:
    """(one-line message, hint) for any exception a command raised."""
    # on use: keeps torch out of the CLI's start
    from pydantic import ValidationError

    from mgrpo.plugins import PluginError
    from mgrpo.training.config_files import ConfigFileError
    from mgrpo.training.run_lock import RunFolderInUse

    if isinstance(exc, UserError | ConfigFileError | RunFolderInUse):
        return str(exc), exc.hint
    if isinstance(exc, PluginError):
        return str(exc), "plug-ins and import paths: docs/extending.md"
    if isinstance(exc, ValidationError):
        # on use: keeps the library out of the CLI's start
        from mgrpo.validation import one_line

        return one_line(exc), "the options are listed in docs/configuration.md"
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError):
        return _flat(f"{exc.strerror or 'not found'}: {exc.filename or exc}"), \
            "check the path (relative paths in a config file start at the file's folder, " \
            "on the command line at the current folder)"
    text = _flat(str(exc)) or type(exc).__name__
    return f"{type(exc).__name__}: {text}", DEBUG_HINT


def _flat(text: str, limit: int = 600) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ErrorReportingGroup(TyperGroup):
    """The root group: exceptions from any (sub)command become one line and exit code 1."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.TyperException, typer.Exit, typer.Abort):  # usage errors: typer's own
            raise
        except Exception as exc:  # noqa: BLE001 (the boundary: every error ends here)
            if debug_enabled():
                raise
            message, hint = describe(exc)
            typer.secho(f"error: {message}", err=True, fg="red")
            if hint:
                typer.echo(f"hint: {hint}", err=True)
            if hint != DEBUG_HINT:
                typer.echo(f"      ({DEBUG_HINT})", err=True)
            ctx.exit(1)
