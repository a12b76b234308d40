"""``/docs`` and ``/redoc`` render in a real browser with no internet (issue 11 item 4).

Headless Chromium (Debian's ``chromium``; ``make test`` installs it) loads the pages from a
real uvicorn on loopback, with every host name resolving to nothing, so a page that needed a
CDN would stay blank. We check the rendered DOM (Swagger UI's operation list and its
Authorize button; ReDoc's operations) and that a screenshot is not blank.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from serving import running_server

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                  "--virtual-time-budget=20000"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("chromium is not installed (make test installs it with apt)")
    pytest.skip("chromium is not installed (make test installs it with apt)")


def _browse(tmp_path, url: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
                           url], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def docs_url():
    from mgrpo.config import Settings
    from mgrpo.services.api.app import create_app
    from mgrpo.services.api.deps import ApiState
    from mgrpo.training.config import ModelConfig, RunConfig

    cfg = RunConfig(models={m: ModelConfig(path="-") for m in ("planner", "searcher", "coder")})
    with running_server(create_app(ApiState(Settings(), cfg, store=None, bus=None))) as url:
        yield url


def test_swagger_ui_renders_offline_with_an_authorize_button(docs_url, tmp_path):
    run = _browse(tmp_path, f"{docs_url}/docs", "--dump-dom")
    dom = run.stdout
    assert "btn authorize" in dom, run.stderr[-2000:]
    for path in ("/v1/queries", "/v1/rounds", "/v1/rounds/{round_id}/cancel", "/healthz"):
        assert f'data-path="{path}"' in dom, path


def test_swagger_ui_screenshot_is_not_blank(docs_url, tmp_path):
    from PIL import Image

    shot = tmp_path / "docs.png"
    _browse(tmp_path, f"{docs_url}/docs", "--window-size=1280,1600", f"--screenshot={shot}")
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # a blank page has one colour
    busiest = max(count for count, _ in colours)
    assert busiest < 0.95 * 1280 * 1600  # not a white page with a speck


def test_redoc_renders_offline(docs_url, tmp_path):
    dom = _browse(tmp_path, f"{docs_url}/redoc", "--dump-dom").stdout
    assert "mgrpo planner API" in dom
    assert "Answer a question (answer + full trace)" in dom, dom[-2000:]
