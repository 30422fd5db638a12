"""Serve the NOC page at `/` and its two assets under `/noc/` (router `router`).

The page itself holds no data and needs no token: every figure on it comes from the API,
which checks the Bearer token the page sends. No build step and no CDN: the files in
static/ are what the browser runs. A strict Content-Security-Policy allows only them.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from service.api.problems import Problem

router = APIRouter(tags=["noc"])

STATIC = Path(__file__).parent / "static"
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)


@router.get("/noc/{name}", include_in_schema=False)
def asset(name: str) -> FileResponse:
    # A fixed list, not a path join: nothing else on disk can be asked for.
    if name not in ASSETS:
        raise Problem(404, "Not found", f"no NOC asset {name!r}")
    return FileResponse(STATIC / name, media_type=ASSETS[name], headers=HEADERS)
