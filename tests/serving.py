"""An ASGI app served for real in the tests (importable from every test: ``tests/`` is on
sys.path through the root conftest). Free ports: ``mgrpo.services.launcher.free_port``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from mgrpo.services.launcher import free_port


@contextlib.contextmanager
def running_server(app) -> Iterator[str]:
    """Serve ``app`` with a real uvicorn on a free port (in a thread), with the services'
    options (``mgrpo.web.server.server_options``); yields its base URL."""
    import uvicorn

    from mgrpo.web.server import server_options

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, **server_options(
        host="127.0.0.1", port=port, log_level="warning")))  # as the services are served
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(400):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
