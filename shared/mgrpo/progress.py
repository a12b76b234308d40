"""Progress bars and log lines for steps that take more than a few seconds
(demonstrations, SFT, evaluation, training rounds), both on stderr.

A bar is drawn only on a terminal: it is quiet when stderr is not one (CI logs, ``nohup``,
``mgrpo up`` children, pipes), when ``MGRPO_PROGRESS=0``, or when the caller passes
``enabled=False``. A log line (:func:`log_line`: one line per round, warm-start step or
evaluation) is written whatever stderr is, so a run under ``nohup`` or a Kubernetes Job
says how it goes; ``MGRPO_QUIET=1`` (``--quiet``) silences lines and bars. Warnings are not
log lines: they are never silenced. Results still go to stdout, so piping a command's JSON
output is unaffected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from tqdm.auto import tqdm


def progress_enabled() -> bool:
    return os.environ.get("MGRPO_PROGRESS", "1").lower() not in ("0", "false", "no", "off")


def quiet() -> bool:
    """``MGRPO_QUIET`` set (``--quiet``): no log lines and no bars, warnings only."""
    return os.environ.get("MGRPO_QUIET", "").lower() in ("1", "true", "yes", "on")


def log_line(text: str, *, warning: bool = False) -> None:
    """One line on stderr, flushed at once, written above a bar drawn at the time.
    Dropped under ``MGRPO_QUIET`` unless it is a ``warning``."""
    if quiet() and not warning:
        return
    tqdm.write(text, file=sys.stderr)
    sys.stderr.flush()


def format_value(value: float) -> str:
    """A metric as a log line shows it: 4 significant digits (0.75, 0.1235, 1.2e-05)."""
    return f"{value:.4g}"


def format_line(head: str, values: dict[str, float], seconds: float | None = None) -> str:
    """``head | key=value | ... | 3.1 s``: the one format of every log line."""
    parts = [head, *(f"{k}={format_value(v)}" for k, v in values.items())]
    if seconds is not None:
        parts.append(f"{seconds:.1f} s")
    return " | ".join(parts)


def progress_bar(iterable: Iterable | None = None, *, desc: str, total: int | None = None,
                 enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr, off unless ``enabled``, MGRPO_PROGRESS allows and stderr is a
    terminal."""
    on = enabled and progress_enabled() and not quiet() and sys.stderr.isatty()
    return tqdm(iterable, desc=desc, total=total, disable=not on, file=sys.stderr,
                dynamic_ncols=True)
