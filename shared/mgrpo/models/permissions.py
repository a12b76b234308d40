"""Model folders are written readable by every user: 0644 files, 0755 folders.

transformers' ``save_pretrained`` writes ``model.safetensors`` through a temporary file
created with mode 0600, so a folder made by ``mgrpo models init-tiny`` as one user could not
be read by the containers' non-root user (uid 10001), and the loader then said "No such file
or directory". Weights are not secrets here; the read bits are added after every write.

What this module does NOT do: change owners, or remove permissions anyone already has.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_BITS, DIR_BITS = 0o644, 0o755


def make_readable(folder: str | Path) -> None:
    """Add read (and, on folders, traverse) bits for everyone under ``folder``, itself too."""
    root = Path(folder)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        bits = DIR_BITS if path.is_dir() else FILE_BITS
        mode = path.stat().st_mode & 0o7777
        if mode & bits != bits:
            os.chmod(path, mode | bits)
