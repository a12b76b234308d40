"""``/docs`` (Swagger UI) and ``/redoc`` served from files on this machine, never a CDN.

FastAPI's default pages load their JavaScript and CSS from a CDN, so without internet they
are blank. The assets come from the ``fastapi-offline`` package (Swagger UI bundle and CSS,
ReDoc standalone); we use only its static files and mount them under ``/docs-assets``.

What this module does NOT do: change the OpenAPI document (the bearer security scheme is
declared by the API's auth dependency).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install_offline_docs(app: FastAPI, title: str) -> None:
    """Serve ``/docs`` and ``/redoc`` from local assets. Create the app with
    ``docs_url=None, redoc_url=None`` so FastAPI's CDN pages are not registered."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} - Swagger UI",
                                   swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS_URL}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi_url, title=f"{title} - ReDoc",
                              redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
                              with_google_fonts=False)
