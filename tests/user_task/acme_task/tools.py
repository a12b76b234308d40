"""Acme's tools: ``HttpSearch``, its search API as a class (its constructor takes the API's
URL from the run config's ``tools:`` entry and checks that the API answers, so a wrong URL
fails at start, not in the middle of a round), and ``calc`` and ``convert``, tools as plain
functions whose schemas come from their signatures and docstrings."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request


class HttpSearch:
    def __init__(self, url: str, k: int = 1, timeout_s: float = 5.0):
        self.url, self.k, self.timeout_s = url.rstrip("/"), k, timeout_s
        with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as reply:
            if reply.status != 200:
                raise RuntimeError(f"search API {self.url} answers {reply.status}")

    def run(self, payload: str) -> str:
        query = urllib.parse.urlencode({"q": payload, "k": self.k})
        try:
            with urllib.request.urlopen(f"{self.url}/search?{query}",
                                        timeout=self.timeout_s) as reply:
                results = json.load(reply)["results"]
        except (OSError, ValueError, KeyError) as error:
            return f"error: search failed ({type(error).__name__})"
        return " ".join(r["text"] for r in results) or "no results"


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / and parentheses.

    Args:
        expression: The expression, e.g. "2 * (3 + 4)".
    """
    if not set(expression) <= set("0123456789.+-*/() "):
        raise ValueError(f"not arithmetic: {expression!r}")
    return f"{eval(expression, {'__builtins__': {}}):g}"  # noqa: S307 (digits and operators)


def convert(value: float, unit: str = "km") -> dict:
    """Convert a distance to metres.

    Args:
        value: How many units.
        unit: The unit, km or mi.
    """
    return {"metres": value * {"km": 1000.0, "mi": 1609.344}[unit]}
