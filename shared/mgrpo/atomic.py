"""Atomic file writes: a reader sees the old file or the new one, never a half-written one.

The text goes to a temporary file beside the target (same filesystem), which then replaces
the target with ``os.replace``. A write that fails (a full disk, text that cannot be
encoded) leaves the target as it was and removes its temporary file. Two writers of the same
path each use their own temporary file; the last ``os.replace`` wins. The new file keeps
the old one's permissions, or is readable by all (0644) when there was none: other users
(the services' user) read what this one writes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    path = Path(path)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            os.fchmod(f.fileno(), mode)  # mkstemp's 0600 would hide it from other users
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
