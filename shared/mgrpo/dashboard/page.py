"""The dashboard page: one self-contained HTML file shipped as package data (no CDN, no
build step), read once per process."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PAGE = Path(__file__).with_name("static") / "dashboard.html"


@lru_cache(maxsize=1)
def html() -> str:
    return PAGE.read_text(encoding="utf-8")
