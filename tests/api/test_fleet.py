"""Topology graph and fleet summary: health from open alerts (alerts service) or, without the
alerts table, from oper status and error counters; counts, worst links and filters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.config import load_settings
from service.fleet import service as fleet
from tests.api.fabric_seed import (
    CONGESTED_HOST,
    FAULTY_LEAF,
    FAULTY_PORT,
    Seeded,
    make_app,
    seed_alerts,
    seed_drain,
    seed_fabric,
)


@pytest.fixture(scope="module")
def fabric(engine: Engine) -> Seeded:
    return seed_fabric(engine)


@pytest.fixture(scope="module")
def client(fabric: Seeded, db_url: str) -> Iterator[TestClient]:
    with TestClient(make_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


def _faulty_edge(topo: dict) -> dict:
    return next(e for e in topo["edges"] if (e["source"], e["source_port"]) == (FAULTY_LEAF, FAULTY_PORT)
                or (e["target"], e["target_port"]) == (FAULTY_LEAF, FAULTY_PORT))


def test_topology_without_alerts_uses_telemetry(client: TestClient, fabric: Seeded,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real = fleet.has_table
    monkeypatch.setattr(fleet, "has_table", lambda conn, name: False if name == "alerts" else real(conn, name))
    topo = client.get("/api/v1/topology").json()
    assert topo["health_source"] == "telemetry"
    assert len(topo["nodes"]) == fabric.devices and len(topo["edges"]) == fabric.links
    edge = _faulty_edge(topo)
    # 6 dB off one lane pushes the BER past what FEC can carry: the simulated link goes down.
    assert edge["health"] in ("down", "warning") and edge["reasons"]
    nodes = {n["id"]: n for n in topo["nodes"]}
    assert nodes[FAULTY_LEAF]["health"] == "warning" and nodes["spine-01"]["health"] == "ok"
    assert nodes["leaf-p1-r1-01"]["rail"] == 1 and nodes["leaf-p2-r0-01"]["rail"] == 0
    summary = client.get("/api/v1/summary").json()
    assert summary["health_source"] == "telemetry" and summary["worst_links"][0]["id"] == edge["id"]


def test_topology_and_summary_with_alerts(client: TestClient, engine: Engine, fabric: Seeded) -> None:
    assert len(seed_alerts(engine, int(fabric.end_s * 1000))) == 2
    drain = seed_drain(engine, fabric.end_s)
    topo = client.get("/api/v1/topology").json()
    assert topo["health_source"] == "alerts"
    nodes = {n["id"]: n for n in topo["nodes"]}
    assert nodes[FAULTY_LEAF]["health"] == "critical" and nodes[FAULTY_LEAF]["alerts"] == 1
    assert nodes[CONGESTED_HOST]["health"] == "warning"
    edge = _faulty_edge(topo)
    assert edge["health"] == "critical" and len(edge["alerts"]) == 1
    p1 = next(p for p in topo["pods"] if p["pod"] == "p1")
    assert p1["health"] == "critical" and next(p for p in topo["pods"] if p["pod"] == "p2")["health"] == "ok"

    s = client.get("/api/v1/summary").json()
    assert s["devices"]["total"] == fabric.devices and s["devices"]["by_role"] == {"leaf": 4, "spine": 2, "host": 8}
    assert s["links"] == fabric.links and s["ports"] == 48 and s["optics"] == 48 and s["pods"] == 2
    assert s["alerts"]["open_by_severity"] == {"page": 1, "ticket": 1}
    assert s["alerts"]["by_state"] == {"firing": 2}
    assert s["targets"] == {"ok": 0, "failing": 0, "never_polled": 0}
    worst = s["worst_links"][0]
    assert worst["id"] == edge["id"] and worst["health"] == "critical" and worst["rx_margin_db"] < 0
    if drain is not None:
        assert s["drains"]["available"] and sum(s["drains"]["by_status"].values()) == 1
        assert s["incidents"]["open"] == 1


def test_topology_filters(client: TestClient) -> None:
    p2 = client.get("/api/v1/topology", params={"pod": "p2"}).json()
    names = {n["id"] for n in p2["nodes"]}
    assert "leaf-p2-r0-01" in names and "spine-01" in names and "leaf-p1-r0-01" not in names
    switches = client.get("/api/v1/topology", params={"hosts": "false"}).json()
    assert {n["role"] for n in switches["nodes"]} == {"leaf", "spine"}
    assert len(switches["edges"]) == 8  # four leaves x two spines
