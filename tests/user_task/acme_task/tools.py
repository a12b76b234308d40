"""``HttpSearch``: Acme's search API as a tool. Its constructor takes the API's URL (from the
run config's ``tools:`` entry) and checks that the API answers, so a wrong URL fails at start,
not in the middle of a round."""

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
