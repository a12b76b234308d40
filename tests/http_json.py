"""A GET of a JSON endpoint (``/healthz``, ``/readyz``) with the standard library
(importable from every test: ``tests/`` is on sys.path through the root conftest)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def get_json(url: str) -> tuple[int, dict]:
    """(status, decoded body), an error status (4xx/5xx) included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
