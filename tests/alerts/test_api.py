"""Alert API: pagination stable under inserts, filters, history, problems, silences, scopes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.alerts.service import apply_findings
from service.api import auth
from service.api.app import create_app
from service.auth.service import create_token
from service.config import load_settings
from service.detection.findings import Severity
from tests.alerts import STEP, T0, finding


def make_app(db_url: str, auth_required: bool) -> FastAPI:
    return create_app(load_settings(database_url=db_url, auth_required=auth_required))


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    with TestClient(make_app(db_url, auth_required=False)) as c:
        yield c


def open_alerts(db: Engine, n: int, start: int = 0, cycle: int = 0, **kw: object) -> None:
    with db.begin() as conn:
        fs = [finding(port=f"Ethernet{start + i}", at_ms=T0 + cycle * STEP, **kw) for i in range(n)]  # type: ignore[arg-type]
        apply_findings(conn=conn, findings=fs, at_ms=T0 + cycle * STEP, kinds=[fs[0].kind] if fs else None)


def page_all(client: TestClient, params: dict[str, object], between: object = None) -> list[int]:
    ids: list[int] = []
    cursor = None
    first = True
    while True:
        r = client.get("/api/v1/alerts", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        ids += [a["id"] for a in body["items"]]
        if first and callable(between):
            between()
            first = False
        cursor = body["next_cursor"]
        if cursor is None:
            return ids


def test_pagination_is_stable_under_inserts(client: TestClient, db: Engine) -> None:
    open_alerts(db, 25)
    before = page_all(client, {"limit": 7})
    assert len(before) == 25 and before == sorted(before, reverse=True)
    # New alerts arrive while a client walks the pages: no duplicates, nothing skipped.
    walked = page_all(client, {"limit": 7}, between=lambda: open_alerts(db, 5, start=100, kind="pause_storm"))
    assert walked == before
    existing = sorted(page_all(client, {"limit": 100}))
    assert len(existing) == 30
    # Oldest first, the newcomers show up at the end of the walk, after everything that was there.
    asc = page_all(client, {"limit": 4, "sort": "created"},
                   between=lambda: open_alerts(db, 3, start=200, kind="x_storm"))
    assert asc[:30] == existing and len(asc) == len(set(asc)) == 33


def test_filters_sort_and_bad_cursor(client: TestClient, db: Engine) -> None:
    open_alerts(db, 3, severity=Severity.TICKET)
    open_alerts(db, 2, start=10, kind="pause_storm", device="leaf-02", severity=Severity.PAGE)
    r = client.get("/api/v1/alerts", params={"severity": "page"}).json()
    assert {a["kind"] for a in r["items"]} == {"pause_storm"} and len(r["items"]) == 2
    r = client.get("/api/v1/alerts", params=[("device", "leaf-01"), ("device", "leaf-02"), ("state", "firing")])
    assert len(r.json()["items"]) == 5
    assert client.get("/api/v1/alerts", params={"kind": "nope"}).json() == {"items": [], "next_cursor": None}
    cursor = client.get("/api/v1/alerts", params={"limit": 1}).json()["next_cursor"]
    r = client.get("/api/v1/alerts", params={"limit": 1, "cursor": cursor, "sort": "updated"})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem+json")
    assert client.get("/api/v1/alerts", params={"cursor": "!!!"}).status_code == 400
    assert client.get("/api/v1/alerts", params={"sort": "bogus"}).status_code == 422


def test_detail_history_actions_and_problems(client: TestClient, db: Engine) -> None:
    open_alerts(db, 1)
    aid = client.get("/api/v1/alerts").json()["items"][0]["id"]
    assert client.post(f"/api/v1/alerts/{aid}/ack", json={"comment": "looking"}).json()["state"] == "acknowledged"
    r = client.post(f"/api/v1/alerts/{aid}/comments", json={"comment": "reseated the module"})
    assert r.status_code == 201 and r.json()["event"] == "commented"
    assert client.post(f"/api/v1/alerts/{aid}/resolve").json()["state"] == "resolved"
    assert client.post(f"/api/v1/alerts/{aid}/ack").status_code == 409
    detail = client.get(f"/api/v1/alerts/{aid}").json()
    assert [e["event"] for e in detail["events"]] == ["opened", "acknowledged", "commented", "resolved"]
    assert {e["actor"] for e in detail["events"][1:]} == {"anonymous (auth disabled)"}
    assert detail["evidence"][0]["feature"] == "rx_power_dbm" and detail["cause"] == "connector_contamination"
    r = client.get("/api/v1/alerts/999999")
    assert r.status_code == 404 and r.json()["title"] == "Not found"
    assert client.post("/api/v1/alerts/999999/ack").status_code == 404
    assert client.post(f"/api/v1/alerts/{aid}/comments", json={"comment": ""}).status_code == 422


def test_silence_and_maintenance_crud(client: TestClient) -> None:
    body = {"matchers": [{"name": "device", "value": "leaf-0[12]", "is_regex": True}],
            "ends_at": "2099-01-01T00:00:00Z", "comment": "optics swap"}
    r = client.post("/api/v1/silences", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert r.json()["status"] == "active" and r.json()["created_by"].startswith("anonymous")
    assert client.patch(f"/api/v1/silences/{sid}", json={"comment": "longer"}).json()["comment"] == "longer"
    assert client.delete(f"/api/v1/silences/{sid}").status_code == 204
    assert client.get(f"/api/v1/silences/{sid}").json()["status"] == "expired"
    bad_regex = dict(body, matchers=[{"name": "device", "value": "(", "is_regex": True}])
    assert client.post("/api/v1/silences", json=bad_regex).status_code == 422
    everything = dict(body, matchers=[{"name": "device", "value": ".*", "is_regex": True}])
    assert client.post("/api/v1/silences", json=everything).status_code == 422
    assert client.post("/api/v1/silences", json=dict(body, matchers=[{"name": "color", "value": "x"}])
                       ).status_code == 422
    r = client.post("/api/v1/maintenance", json={"device": "leaf-01", "ends_at": "2099-01-01T00:00:00Z"})
    assert r.status_code == 201 and r.json()["port"] is None
    wid = r.json()["id"]
    assert client.patch(f"/api/v1/maintenance/{wid}", json={"starts_at": "2100-01-01T00:00:00Z"}).status_code == 422
    assert client.delete(f"/api/v1/maintenance/{wid}").status_code == 204
    assert client.get("/api/v1/maintenance").json()[0]["status"] == "expired"
    assert client.delete("/api/v1/maintenance/999").status_code == 404


def test_scopes(db: Engine, db_url: str) -> None:
    auth._failures.clear()
    open_alerts(db, 1)
    with db.begin() as conn:
        read, op, admin = (create_token(conn, name=f"t-{s}", scopes=[s]) for s in ("read", "operate", "admin"))
    with TestClient(make_app(db_url, auth_required=True)) as c:
        h = {s: {"authorization": f"Bearer {t}"} for s, t in (("read", read), ("operate", op), ("admin", admin))}
        assert c.get("/api/v1/alerts").status_code == 401
        aid = c.get("/api/v1/alerts", headers=h["read"]).json()["items"][0]["id"]
        r = c.post(f"/api/v1/alerts/{aid}/ack", headers=h["read"])
        assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json")
        assert c.post(f"/api/v1/alerts/{aid}/comments", json={"comment": "x"}, headers=h["read"]).status_code == 403
        silence = {"matchers": [{"name": "device", "value": "leaf-01"}], "ends_at": "2099-01-01T00:00:00Z",
                   "comment": "c"}
        assert c.post("/api/v1/silences", json=silence, headers=h["read"]).status_code == 403
        assert c.post("/api/v1/silences", json=silence, headers=h["operate"]).status_code == 201
        r = c.post(f"/api/v1/alerts/{aid}/ack", headers=h["operate"])
        assert r.status_code == 200 and r.json()["acknowledged_by"] == "t-operate"
        assert c.get("/api/v1/webhooks", headers=h["operate"]).status_code == 403
        assert c.get("/api/v1/webhooks", headers=h["admin"]).status_code == 200
