"""API documentation pages that work offline: Swagger UI at ``/docs`` and ReDoc at ``/redoc``, served from a package.

FastAPI's own pages load Swagger UI and ReDoc from ``cdn.jsdelivr.net``, so on a machine without internet (the usual
place of a local roleplay setup) ``/docs`` stayed blank. :func:`install_docs` serves the files of the
``fastapi-offline`` package instead (Swagger UI 5, which renders OpenAPI 3.1 as FastAPI emits it, ReDoc 2 and a
favicon), mounted at :data:`ASSETS_PATH`; the pages reference only those same-origin URLs (prefixed with the ASGI
``root_path`` behind a proxy, as FastAPI does), and ReDoc gets no Google Fonts.

Usage::

    app = FastAPI(docs_url=None, redoc_url=None)    # FastAPI's CDN pages off
    install_docs(app)

Auth is not special-cased here: the service's token middleware lets these pages, the assets and the OpenAPI schema
through without the token when ``service.public_docs`` is on (the default), and guards them like any route otherwise.
"""

from __future__ import annotations

import os
from pathlib import PurePath

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse, Response
from starlette.types import Scope

__all__ = ["ASSETS_PATH", "ASSET_PACKAGE", "DOCS_PATH", "REDOC_PATH", "install_docs"]

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
#: Where the package's files are mounted (under ``/docs``: one prefix for the token middleware to open under
#: ``service.public_docs``).
ASSETS_PATH = "/docs/assets"
#: (package, directory) holding ``swagger-ui-bundle.js``, ``swagger-ui.css``, ``redoc.standalone.js``, ``favicon.png``.
ASSET_PACKAGE = ("fastapi_offline", "static")

# Fixed types instead of the platform's guess (mimetypes reads /etc/mime.types and, on Windows, the registry, which
# some installs map ``.js`` to ``text/plain``: a browser then refuses the script under ``nosniff``).
_MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}


class _Assets(StaticFiles):
    """The package's files with the media types of :data:`_MEDIA_TYPES`."""

    def file_response(
        self, full_path: str | os.PathLike[str], stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        media_type = _MEDIA_TYPES.get(PurePath(full_path).suffix.lower())
        if media_type is not None:
            response.headers["content-type"] = media_type
        return response


def install_docs(app: FastAPI) -> None:
    """Mount the assets and add the ``/docs`` and ``/redoc`` pages to ``app`` (created with ``docs_url=None`` and
    ``redoc_url=None``). The pages are left out of the OpenAPI schema. Raises ``RuntimeError`` (from Starlette)
    when the asset package is not installed."""
    app.mount(ASSETS_PATH, _Assets(packages=[ASSET_PACKAGE]), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        prefix = root(request)
        return get_swagger_ui_html(
            openapi_url=f"{prefix}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{prefix}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{prefix}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{prefix}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        prefix = root(request)
        return get_redoc_html(
            openapi_url=f"{prefix}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{prefix}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{prefix}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
