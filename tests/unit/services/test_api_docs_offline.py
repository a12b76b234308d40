"""``/docs`` and ``/redoc`` work without internet (issue 11 item 4): their pages reference
only assets the service itself serves, and the bearer token is a security scheme (so Swagger
UI shows an Authorize button). The rendered page is checked with headless Chromium in
``test_api_docs_render.py``."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from mgrpo.services.api.app import openapi_document
from mgrpo.web.docs_assets import ASSETS_URL


@pytest.fixture(scope="module")
def docs_client():
    from mgrpo.config import Settings
    from mgrpo.services.api.app import create_app
    from mgrpo.services.api.deps import ApiState
    from mgrpo.training.config import ModelConfig, RunConfig

    cfg = RunConfig(models={m: ModelConfig(path="-") for m in ("planner", "searcher", "coder")})
    with TestClient(create_app(ApiState(Settings(), cfg, store=None, bus=None))) as client:
        yield client


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_doc_pages_load_only_local_assets(docs_client, page):
    html = docs_client.get(page).text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert urls, html
    assert all(u.startswith(ASSETS_URL) for u in urls), urls
    assert "cdn" not in html.lower() and "fonts.googleapis" not in html
    for url in urls:
        asset = docs_client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 1000, url


def test_the_token_is_a_bearer_security_scheme():
    document = openapi_document()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer",
        "description": "The value of MGRPO_API_TOKEN on the planner service."}
    assert document["paths"]["/v1/queries"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in document["paths"]["/v1/rounds"]["get"]  # reads are open
