"""A stand-in for Acme's search API on 127.0.0.1: ``GET /health`` and
``GET /search?q=...&k=N`` -> ``{"results": [{"id", "title", "text"}]}``, documents ranked by
the words they share with the query. Every request is recorded (``requests``), so a test can
see which process called it."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower())) - {"the", "of", "is", "what", "a"}


class SearchAPI:
    def __init__(self, documents: Path):
        self.docs = [json.loads(line) for line in documents.read_text().splitlines() if line]
        self.requests: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                url = urlparse(self.path)
                api.requests.append(self.path)
                if url.path == "/health":
                    return self._reply({"ok": True})
                if url.path != "/search":
                    return self._reply({"error": "not found"}, 404)
                args = parse_qs(url.query)
                query = _words(args.get("q", [""])[0])
                k = int(args.get("k", ["1"])[0])
                ranked = sorted(api.docs, key=lambda d: -len(query & _words(d["text"])))
                return self._reply({"results": [d for d in ranked[:k]
                                                if query & _words(d["text"])]})

            def _reply(self, body, status=200):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def searches(self) -> list[str]:
        return [r for r in self.requests if r.startswith("/search")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
