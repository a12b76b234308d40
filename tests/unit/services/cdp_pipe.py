"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (no websocket,
no selenium, no download): Chromium reads NUL-terminated JSON commands on fd 3 and writes
replies and events on fd 4. Enough to open a page, evaluate JavaScript, wait for the DOM
and take a screenshot in the browser tests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> None:
    """In a test: fail under ``CI=true`` (a required part is missing), else skip, when
    Chromium is not installed."""
    import pytest

    if chromium_path() is None:
        message = "chromium is not installed (make browser-deps installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


class Browser:
    """One headless Chromium with one page (``open``); close with :meth:`close`."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1800):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [*FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                f"--window-size={width},{height}", "about:blank"]
        # bash puts our pipe ends on fds 3 and 4, where --remote-debugging-pipe expects them
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}',
             chromium_path(), *args], pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None
        self.size = (width, height)

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies[-1] = {"closed": True}
                    self._cond.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._cond:
                        self._replies[message["id"]] = message
                        self._cond.notify_all()

    def send(self, method: str, params: dict | None = None, session: bool = True,
             timeout: float = 60.0) -> dict:
        self._next_id += 1
        ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._replies:
                if -1 in self._replies or time.monotonic() > deadline:
                    raise TimeoutError(f"no CDP reply to {method} (browser closed or slow)")
                self._cond.wait(0.2)
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(f"CDP {method}: {reply['error']}")
        return reply.get("result", {})

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                           "flatten": True},
                                 session=False)["sessionId"]
        self._viewport(*self.size)
        self.send("Page.navigate", {"url": url})
        self.wait_for(f"location.href === {json.dumps(url)} && "
                      "document.readyState === 'complete'", what=f"{url} to load")

    def _viewport(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1,
                                                         "mobile": False})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = ""):
        """Poll ``expression`` until it is truthy; returns its value. A JS error (the
        element is not there yet) counts as not yet."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as error:
                value = error
            if value and not isinstance(value, RuntimeError):
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what or expression} (last: {value!r})")

    def screenshot(self, path: Path, selector: str | None = None) -> Path:
        """The viewport, or with ``selector`` only that element, whole: the viewport is first
        made as tall as the page (so nothing is laid out again while capturing)."""
        params: dict = {"format": "png", "captureBeyondViewport": False}
        if selector is not None:
            width, height = self.size
            full = self.evaluate("document.documentElement.scrollHeight")
            self._viewport(width, max(height, int(full)))
            time.sleep(0.5)  # the new layout
            box = self.evaluate(f"(r => r && {{x: r.left + scrollX, y: r.top + scrollY, "
                                f"width: r.width, height: r.height}})(document.querySelector("
                                f"{json.dumps(selector)})?.getBoundingClientRect())")
            if not box:
                raise AssertionError(f"no element {selector!r} to take a screenshot of")
            params["clip"] = {**box, "scale": 1}
        try:
            data = self.send("Page.captureScreenshot", params)["data"]
        finally:
            if selector is not None:
                self._viewport(*self.size)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", session=False, timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
