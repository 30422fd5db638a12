"""Oversized bodies and deeply nested JSON are refused with 4xx problems, never a 500 or a hang;
hostile strings in the inventory are stored and shown as data."""

from __future__ import annotations

import gzip
import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.config import load_settings
from tests.badinput import full_app
from tests.faults.peers import load_inventory

LIMIT = 64 * 1024


@pytest.fixture()
def client(db: Engine, db_url: str) -> TestClient:
    return TestClient(full_app(load_settings(database_url=db_url, auth_required=False, max_body_bytes=LIMIT)))


def _problem(r, status: int) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text[:300]
    assert r.headers["content-type"] == "application/problem+json"


def test_import_refuses_oversized_body_declared_streamed_and_gzipped(client: TestClient) -> None:
    big = b'port_rx_bytes_total{device="x",port="y"} 1 1\n' * (LIMIT // 40)
    _problem(client.post("/api/v1/import/prometheus", content=big), 413)

    def chunks():  # type: ignore[no-untyped-def]
        yield big  # no content-length: refused while streaming

    _problem(client.post("/api/v1/import/prometheus", content=chunks()), 413)
    bomb = gzip.compress(b"#" * (LIMIT * 50))
    assert len(bomb) < LIMIT
    _problem(client.post("/api/v1/import/prometheus", content=bomb, headers={"content-encoding": "gzip"}), 413)


def _json_post_routes(client: TestClient) -> list[str]:
    spec = client.get("/openapi.json").json()
    return [p for p, ops in spec["paths"].items() if "post" in ops and "requestBody" in ops["post"]
            and "application/json" in ops["post"]["requestBody"].get("content", {}) and "{" not in p]


def test_json_endpoints_refuse_oversized_bodies(client: TestClient) -> None:
    routes = _json_post_routes(client)
    assert routes
    body = json.dumps({"pad": "x" * (LIMIT * 2)})
    got = {p: client.post(p, content=body, headers={"content-type": "application/json"}).status_code for p in routes}
    assert all(code == 413 for code in got.values()), got


def test_deeply_nested_json_is_a_4xx_problem(client: TestClient) -> None:
    routes = _json_post_routes(client)
    nested = "[" * 10_000 + "]" * 10_000
    got = {}
    for p in routes:
        r = client.post(p, content=nested, headers={"content-type": "application/json"})
        got[p] = r.status_code
        assert r.headers["content-type"] == "application/problem+json", (p, r.text[:200])
    assert all(400 <= code < 500 for code in got.values()), got


HOSTILE = ["x'); DROP TABLE devices;--", "<script>alert(1)</script>", "\u202eevil\u202c", "名前-ü-😀", 'q"uo\\te']


def test_hostile_inventory_strings_are_stored_and_served_as_data(db_url: str, client: TestClient) -> None:
    devices = [{"name": f"hx-{i}", "kind": "switch", "role": "leaf", "rack": s, "model": s, "vendor": s,
                "ports": [{"name": "Ethernet1"}]} for i, s in enumerate(HOSTILE)]
    load_inventory(db_url, devices)
    r = client.get("/api/v1/devices", params={"limit": 100})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    served = {d["name"]: d for d in r.json()["items"]}
    for i, s in enumerate(HOSTILE):
        assert served[f"hx-{i}"]["rack"] == s and served[f"hx-{i}"]["model"] == s
    assert "<script>" not in r.text or "\\u003c" in r.text or r.headers["content-type"] != "text/html"
    r = client.get("/api/v1/devices", params={"pod": HOSTILE[0], "role": HOSTILE[1]})
    assert r.status_code in (200, 400, 422), r.text
