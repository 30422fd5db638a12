"""Inventory API on a simulated fabric in real PostgreSQL: filters, keyset pagination under inserts,
device detail, ports, links, optics with DOM margins, problem+json errors, scopes, and no secrets."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api import auth
from service.auth.service import create_token
from service.config import load_settings
from tests.api.fabric_seed import FAULTY_LEAF, FAULTY_PORT, Seeded, make_app, seed_fabric


@pytest.fixture(scope="module")
def fabric(engine: Engine) -> Seeded:
    return seed_fabric(engine)


@pytest.fixture(scope="module")
def client(fabric: Seeded, db_url: str) -> Iterator[TestClient]:
    with TestClient(make_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


def test_devices_filter_by_role_and_pod(client: TestClient, fabric: Seeded) -> None:
    everything = client.get("/api/v1/devices", params={"limit": 1000}).json()
    assert len(everything["items"]) == fabric.devices and everything["next_cursor"] is None
    leaves = client.get("/api/v1/devices", params={"role": "leaf", "pod": "p1"}).json()["items"]
    assert [d["name"] for d in leaves] == ["leaf-p1-r0-01", "leaf-p1-r1-01"]
    assert all(d["ports"] == 6 and d["kind"] == "switch" for d in leaves)
    assert client.get("/api/v1/devices", params={"pod": "nope"}).json() == {"items": [], "next_cursor": None}


def test_cursor_pagination_is_stable_under_inserts(client: TestClient, engine: Engine, fabric: Seeded) -> None:
    before = [d["name"] for d in client.get("/api/v1/devices", params={"limit": 1000}).json()["items"]]
    seen: list[str] = []
    page = client.get("/api/v1/devices", params={"limit": 4}).json()
    seen += [d["name"] for d in page["items"]]
    # Rows that sort before and after the cursor arrive between pages; offsets would repeat or skip rows.
    with engine.begin() as conn:
        for name in ("aaa-new-host", "host-p1-00001a", "zzz-new-host"):
            conn.execute(text("INSERT INTO devices (name, kind, role, gpus) VALUES (:n, 'host', 'host', 0)"),
                         {"n": name})
    while page["next_cursor"]:
        page = client.get("/api/v1/devices", params={"limit": 4, "cursor": page["next_cursor"]}).json()
        seen += [d["name"] for d in page["items"]]
    try:
        assert len(seen) == len(set(seen)), "a row came twice"
        assert set(before) <= set(seen), "a row that existed before the walk was skipped"
        assert seen == sorted(seen)
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM devices WHERE name IN ('aaa-new-host', 'host-p1-00001a', 'zzz-new-host')"))


def test_bad_cursor_and_unknown_device_are_problems(client: TestClient) -> None:
    r = client.get("/api/v1/devices", params={"cursor": "not-a-cursor"})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["title"] == "Bad cursor"
    links_cursor = client.get("/api/v1/links", params={"limit": 1}).json()["next_cursor"]
    assert client.get("/api/v1/devices", params={"cursor": links_cursor}).status_code == 400
    r = client.get("/api/v1/devices/no-such-switch")
    assert r.status_code == 404 and r.json()["status"] == 404
    assert client.get("/api/v1/devices", params={"limit": 0}).status_code == 422


def test_device_detail_has_ports_peers_and_oper_status(client: TestClient) -> None:
    d = client.get(f"/api/v1/devices/{FAULTY_LEAF}").json()
    assert d["role"] == "leaf" and len(d["ports"]) == 6
    p = next(p for p in d["ports"] if p["name"] == FAULTY_PORT)
    assert p["peer"]["device"] == "host-p1-00001" and p["peer"]["port"] == "eth0"
    assert p["optic"]["lanes"] == 4 and p["oper_up"] in (True, False) and p["oper_at"]


def test_ports_and_links(client: TestClient, fabric: Seeded) -> None:
    ports = client.get("/api/v1/ports", params={"device": "host-p1-00001"}).json()["items"]
    assert [(p["name"], p["rail"], p["peer_device"]) for p in ports] == [
        ("eth0", 0, "leaf-p1-r0-01"), ("eth1", 1, "leaf-p1-r1-01")]
    links, cursor = [], None
    while True:
        page = client.get("/api/v1/links", params={"limit": 7, **({"cursor": cursor} if cursor else {})}).json()
        links += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(links) == fabric.links and len({x["id"] for x in links}) == fabric.links
    mine = client.get("/api/v1/links", params={"device": FAULTY_LEAF}).json()["items"]
    assert len(mine) == 6 and all(FAULTY_LEAF in (x["a"]["device"], x["b"]["device"]) for x in mine)


def test_optics_carry_dom_thresholds_and_margins(client: TestClient) -> None:
    item = client.get("/api/v1/optics", params={"device": FAULTY_LEAF, "port": FAULTY_PORT}).json()["items"][0]
    th = item["thresholds"]["rx_power_dbm"]
    lanes = {ln["lane"]: ln for ln in item["dom"]["lanes"]}
    assert sorted(lanes) == [0, 1, 2, 3]
    bad = lanes[1]["rx_power_dbm"]
    # The dirty connector took 6 dB off lane 1: below the module's own low-warning threshold.
    assert bad["value"] < th["low_warning"] and bad["margin"]["low_warning"] < 0 and bad["status"] != "ok"
    assert abs(bad["margin"]["low_warning"] - (bad["value"] - th["low_warning"])) < 1e-3
    assert lanes[0]["rx_power_dbm"]["status"] == "ok" and "tx_bias_amperes" in lanes[0]
    assert item["worst_rx_margin"]["lane"] == 1 and item["status"] in ("warning", "alarm")
    assert "temperature_celsius" in item["dom"]["module"]
    page = client.get("/api/v1/optics", params={"limit": 5}).json()
    assert len(page["items"]) == 5 and page["next_cursor"]


def test_endpoint_config_and_secret_references_are_never_returned(client: TestClient, engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO endpoints (device_id, protocol, address, port, config) "
            "SELECT id, 'snmp', '10.0.0.9', 161, CAST(:cfg AS jsonb) FROM devices WHERE name = :d"),
            {"d": FAULTY_LEAF, "cfg": json.dumps({"version": "2c", "community": {"env": "SECRET_COMMUNITY_VAR"}})})
    try:
        for path in ("/api/v1/devices?limit=1000", f"/api/v1/devices/{FAULTY_LEAF}"):
            body = client.get(path).text
            assert "SECRET_COMMUNITY_VAR" not in body and "community" not in body and '"config"' not in body
        eps = client.get(f"/api/v1/devices/{FAULTY_LEAF}").json()["endpoints"]
        assert eps[0]["protocol"] == "snmp" and eps[0]["address"] == "10.0.0.9" and eps[0]["state"] == "never_polled"
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM endpoints WHERE address = '10.0.0.9'"))


def test_read_scope_is_required(fabric: Seeded, db_url: str, engine: Engine) -> None:
    auth._failures.clear()
    with engine.begin() as conn:
        read = create_token(conn, name="inv-read", scopes=["read"])
        ingest = create_token(conn, name="inv-ingest", scopes=["ingest"])
    c = TestClient(make_app(load_settings(database_url=db_url, auth_required=True)))
    for path in ("/api/v1/devices", f"/api/v1/devices/{FAULTY_LEAF}", "/api/v1/ports", "/api/v1/links",
                 "/api/v1/optics", "/api/v1/topology", "/api/v1/summary"):
        assert c.get(path).status_code == 401, path
        assert c.get(path, headers={"authorization": f"Bearer {ingest}"}).status_code == 403, path
        assert c.get(path, headers={"authorization": f"Bearer {read}"}).status_code == 200, path
