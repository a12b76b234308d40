"""Progress bars for steps that take more than a few seconds (demonstrations, SFT,
evaluation, training rounds): one tqdm bar on stderr.

Quiet where a bar would only add noise: when stderr is not a terminal (CI logs, ``mgrpo up``
children, pipes), or when ``MGRPO_PROGRESS=0``, or when the caller passes ``enabled=False``.
Results still go to stdout, so piping a command's JSON output is unaffected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from tqdm.auto import tqdm


def progress_enabled() -> bool:
    return os.environ.get("MGRPO_PROGRESS", "1").lower() not in ("0", "false", "no", "off")


def progress_bar(iterable: Iterable | None = None, *, desc: str, total: int | None = None,
                 enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr, off unless ``enabled``, MGRPO_PROGRESS allows and stderr is a
    terminal."""
    on = enabled and progress_enabled() and sys.stderr.isatty()
    return tqdm(iterable, desc=desc, total=total, disable=not on, file=sys.stderr,
                dynamic_ncols=True)
