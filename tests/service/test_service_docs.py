"""``/docs`` and ``/redoc`` work offline: their pages reference only same-origin assets, served from the
``fastapi-offline`` package through the real HTTP server (:mod:`memory_recall.service.docs`); the OpenAPI schema
documents the request fields."""

from __future__ import annotations

import re
import socket
from typing import Any

import httpx
import pytest

URL_ATTR = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']*)["']""")

#: asset → (content type, a marker of the real file, minimum size in bytes)
ASSETS: dict[str, tuple[str, bytes, int]] = {
    "/docs/assets/swagger-ui-bundle.js": ("text/javascript; charset=utf-8", b"SwaggerUIBundle", 500_000),
    "/docs/assets/swagger-ui.css": ("text/css; charset=utf-8", b".swagger-ui", 50_000),
    "/docs/assets/redoc.standalone.js": ("text/javascript; charset=utf-8", b"Redoc", 500_000),
    "/docs/assets/favicon.png": ("image/png", b"\x89PNG\r\n\x1a\n", 1_000),
}


def _page(client: httpx.Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    return response.text


class TestDocsPages:
    def test_swagger_ui_references_only_same_origin_assets(self, live_server: Any) -> None:
        _, client = live_server()
        html = _page(client, "/docs")
        assert URL_ATTR.findall(html) == [
            "/docs/assets/swagger-ui.css", "/docs/assets/favicon.png", "/docs/assets/swagger-ui-bundle.js",
        ]
        assert "url: '/openapi.json'" in html
        assert "<title>memory-recall - Swagger UI</title>" in html
        # No other host in any form: absolute ("https://…") or protocol-relative ("//host/…").
        assert "cdn.jsdelivr.net" not in html and "//" not in html

    def test_redoc_references_only_same_origin_assets(self, live_server: Any) -> None:
        _, client = live_server()
        html = _page(client, "/redoc")
        assert URL_ATTR.findall(html) == [
            "/docs/assets/favicon.png", "/openapi.json", "/docs/assets/redoc.standalone.js",
        ]
        assert "fonts.googleapis.com" not in html and "//" not in html

    @pytest.mark.parametrize("path", list(ASSETS))
    def test_assets_are_served(self, live_server: Any, path: str) -> None:
        _, client = live_server()
        content_type, marker, min_size = ASSETS[path]
        response = client.get(path)
        assert response.status_code == 200
        assert response.headers["content-type"] == content_type
        assert len(response.content) >= min_size
        if path.endswith(".png"):
            assert response.content.startswith(marker)
        else:
            assert marker in response.content

    def test_only_the_asset_directory_is_mounted(self, live_server: Any) -> None:
        _, client = live_server()
        for path in ("/docs/assets/__init__.py", "/docs/assets/core.py", "/docs/assets/missing.js"):
            assert client.get(path).status_code == 404, path

    def test_docs_pages_are_not_api_routes(self, live_server: Any) -> None:
        _, client = live_server()
        paths = client.get("/openapi.json").json()["paths"]
        assert [p for p in paths if not p.startswith("/v1/")] == []

    def test_token_guards_docs_and_assets_without_public_docs(self, live_server: Any) -> None:
        server, client = live_server(token="s3cret-token", public_docs=False)
        for path in ("/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js", "/openapi.json"):
            assert httpx.get(server.url + path).status_code == 401, path
            assert client.get(path).status_code == 200, path

    def test_public_docs_open_without_the_token(self, live_server: Any) -> None:
        # The default: the docs open in a browser, which cannot send the bearer token; the API stays closed.
        server, _ = live_server(token="s3cret-token")
        with httpx.Client(base_url=server.url) as anon:
            for path in ("/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js", "/openapi.json"):
                assert anon.get(path).status_code == 200, path
            assert anon.get("/openapi.json").json()["info"]["title"] == "memory-recall"
            for path in ("/v1/chats", "/v1/version", "/docs/", "/openapi.json/", "/redoc/x", "/docsx"):
                assert anon.get(path).status_code == 401, path

    def test_public_asset_prefix_opens_nothing_else(self, live_server: Any) -> None:
        # uvicorn percent-decodes the path but leaves '..' in it: a traversal under the open prefix reaches no route.
        server, client = live_server(token="s3cret-token")
        assert client.post("/v1/chats/c1/nodes", json={"nodes": [{"id": "n1", "type": "event"}]}).status_code == 200
        port = server.url.rsplit(":", 1)[1]
        for raw in (b"/docs/assets/../../v1/chats", b"/docs/assets/..%2F..%2Fv1%2Fchats", b"/docs/assets/%2e%2e/x"):
            with socket.create_connection(("127.0.0.1", int(port)), timeout=30) as sock:
                sock.sendall(b"GET " + raw + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            assert data.startswith(b"HTTP/1.1 404 "), raw
            assert b"c1" not in data, raw


def test_openapi_shows_the_locale_field(live_server: Any) -> None:
    _, client = live_server()
    schema = client.get("/openapi.json").json()
    assert schema["components"]["schemas"]["RecallRequest"]["properties"]["locale"] == {
        "anyOf": [{"type": "string", "maxLength": 35}, {"type": "null"}],
        "pattern": "^[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*$",
        "title": "Locale",
        "description": "Language of reason_text (BCP-47 tag): zh… gives the reference's Chinese texts, else English.",
        "examples": ["en", "en-US", "zh-CN"],
    }
