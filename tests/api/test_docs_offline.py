"""/docs and /redoc work without internet: every URL the pages reference is served by this API from the
installed package's assets. And one access policy for what lies outside /api/v1: open without a token,
each such route named in docs/api.md (/api/v1 needing a token is tests/badinput/test_security.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.api import auth
from service.api.app import create_app
from service.config import load_settings
from tests.badinput.test_security import _routes
from tests.paths import REPO

_URLS = re.compile(r"""(?:href|src|spec-url)=["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")
_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}


@pytest.fixture(scope="module")
def client(db_url: str) -> Iterator[TestClient]:
    auth._failures.clear()
    with TestClient(create_app(load_settings(database_url=db_url))) as c:  # auth required, and no token sent
        yield c


@pytest.mark.parametrize(("page", "script", "marker"), [("/docs", "swagger-ui-bundle.js", "SwaggerUIBundle"),
                                                        ("/redoc", "redoc.standalone.js", "Redoc")])
def test_docs_pages_reference_only_local_assets(client: TestClient, page: str, script: str, marker: str) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "http://" not in r.text and "https://" not in r.text, "the page reaches outside this server"
    urls = [a or b for a, b in _URLS.findall(r.text)]
    assert "/openapi.json" in urls and any(u.endswith(script) for u in urls), urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        kind = next(t for ext, t in _TYPES.items() if url.endswith(ext))
        assert kind in asset.headers["content-type"], (url, asset.headers["content-type"])
        if url.endswith(script):
            assert len(asset.content) > 200_000 and marker.encode() in asset.content  # the real bundle


def test_swagger_ui_can_read_this_openapi_version(client: TestClient) -> None:
    # Swagger UI 4 shows "unable to render" for OpenAPI 3.1 documents, which FastAPI writes.
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")
    assert b"isOAS31" in client.get("/docs/assets/swagger-ui-bundle.js").content


def test_everything_outside_api_v1_is_open_and_documented(client: TestClient) -> None:
    doc = (REPO / "docs" / "api.md").read_text()
    access = doc.split("## Access control", 1)[1].split("\n## ", 1)[0]
    outside = sorted({r.path for r in _routes(client.app.routes) if not r.path.startswith("/api/v1")})
    assert {"/metrics", "/docs", "/openapi.json", "/healthz"} <= set(outside)
    for path in outside:
        assert f"`{path}" in access, f"{path} is served without a token but docs/api.md's Access control omits it"
    for path in ("/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/healthz", "/",
                 "/docs/assets/swagger-ui.css", "/noc/app.js"):
        assert client.get(path).status_code == 200, path
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert b"fabricwatch_http_request_seconds" in metrics.content
    assert client.get("/api/v1/summary").status_code == 401  # the fleet's data is not open
