"""Container health probe: exit 0 when an HTTP health endpoint answers 2xx, else 1.

Usage: ``python healthcheck.py [URL]``. Without a URL it probes the worker health server,
``http://127.0.0.1:$MGRPO_HEALTH_PORT/healthz`` (port 9100 by default).

Standard library only, so the images need no curl. It does NOT check readiness (``/readyz``):
Docker restarts nothing on an unhealthy status, and compose's ``service_healthy`` only needs
the process to be up and serving.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    port = os.environ.get("MGRPO_HEALTH_PORT", "9100")
    url = argv[1] if len(argv) > 1 else f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if 200 <= response.status < 300 else 1
    except (urllib.error.URLError, OSError) as error:
        print(f"healthcheck: {url} failed: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
