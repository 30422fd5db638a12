"""The NOC page: served with a strict CSP, assets from a fixed list, and rendered by headless
Chromium against a live API with a seeded alert (needs the Debian `chromium` package)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.auth.service import create_token
from service.config import load_settings
from tests import live_api as live
from tests.api import chromium
from tests.api.chromium import needs_chromium
from tests.api.fabric_seed import FAULTY_LEAF, Seeded, make_app, seed_alerts, seed_drain, seed_fabric


@pytest.fixture(scope="module")
def fabric(engine: Engine) -> Seeded:
    return seed_fabric(engine)


def test_page_and_assets(fabric: Seeded, db_url: str) -> None:
    c = TestClient(make_app(load_settings(database_url=db_url, auth_required=True)))
    r = c.get("/")   # the page holds no data, so it needs no token; the API calls it makes do
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert '<script src="/noc/app.js"' in r.text and "http" not in r.text.split("<body>")[1]  # no CDN
    assert c.get("/noc/app.js").headers["content-type"].startswith("text/javascript")
    assert c.get("/noc/style.css").status_code == 200
    for bad in ("/noc/index.html", "/noc/..%2fviews.py", "/noc/views.py"):
        assert c.get(bad).status_code == 404, bad


@pytest.fixture()
def live_url(fabric: Seeded, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(live, "create_app", make_app)
    with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
        yield base


@needs_chromium
def test_chromium_renders_alerts_map_and_drains(live_url: str, engine: Engine, fabric: Seeded,
                                                tmp_path: Path) -> None:
    opened = seed_alerts(engine, int(fabric.end_s * 1000))
    if opened is None:
        pytest.skip("service.alerts has not landed: no alert to render")
    drain = seed_drain(engine, fabric.end_s)
    with engine.begin() as conn:
        token = create_token(conn, name="noc-page", scopes=["read"])
    url = f"{live_url}/?token={token}"
    dom = chromium.run(url, tmp_path, "--dump-dom")
    assert 'data-loaded="1"' in dom
    rows = re.findall(r'class="click alert-row" data-alert-id="(\d+)"', dom)
    assert sorted(int(x) for x in rows) == sorted(opened)
    assert "Rx power on lane 1 fell 6 dB in one step" in dom and "clean connectors" in dom
    assert "rx_power_dbm" in dom  # evidence chips
    assert re.search(rf'data-device="{FAULTY_LEAF}" data-health="critical"', dom)
    if drain is not None:
        assert f'data-drain-id="{drain}"' in dom and ("SAFE" in dom or "BLOCKED" in dom)
    chromium.screenshot(url, tmp_path, "noc.png")
