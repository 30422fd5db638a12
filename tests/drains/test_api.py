"""The drains API (scopes, approve/reject/done, breaker) and the pipeline entry point for findings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.alerts.service import resolve
from service.api import auth
from service.api.app import create_app
from service.auth.service import create_token
from service.config import load_settings
from service.detection.findings import Action, Cause, Finding, Severity
from service.drains import service
from service.drains.schemas import Target, TargetKind
from service.pipeline import CycleOutcome, apply_cycle
from tests.drains import SMALL, load_fabric, settings

AT = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def make_app(db_url: str) -> FastAPI:
    return create_app(load_settings(database_url=db_url))


@pytest.fixture()
def client(db: Engine, db_url: str) -> TestClient:
    auth._failures.clear()
    return TestClient(make_app(db_url))


def _h(db: Engine, scope: str) -> dict[str, str]:
    with db.begin() as conn:
        return {"authorization": f"Bearer {create_token(conn, name=f'{scope}-user', scopes=[scope])}"}


def _finding(device: str, port: str | None, cause: Cause, scope: str = "link", peer: str | None = None) -> Finding:
    return Finding(kind="post_fec", scope=scope, device=device, port=port, lane=None, cause=cause,
                   severity=Severity.PAGE, action=Action.CLEAN, state="firing", score=3.0,
                   at_ms=int(AT.timestamp() * 1000), summary=f"{cause} on {device}:{port}", peer_device=peer)


def test_findings_map_to_targets_and_actions(db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    with db.begin() as conn:
        link = service.recommend_for_finding(conn=conn, finding=_finding("leaf-p1-r0-01", "Ethernet1/5",
                                                                          Cause.CONTAMINATION), settings=s)
        nic = service.recommend_for_finding(conn=conn, finding=_finding("host-p1-00002", "eth1",
                                                                         Cause.NIC_PAUSE_STORM), settings=s)
        congested = service.recommend_for_finding(conn=conn, finding=_finding("leaf-p1-r0-01", "Ethernet1/6",
                                                                               Cause.CONGESTION), settings=s)
    assert link is not None and link.action == "shut_ports" and link.status == "pending"
    assert (link.peer_device, link.peer_port, link.cause) == ("spine-01", "Ethernet1/1", "connector_contamination")
    assert link.created_at == AT   # data time of the finding
    assert nic is not None and nic.action == "slurm_drain" and nic.commands[0]["argv"] == [
        "scontrol", "update", "NodeName=host-p1-00002", "State=DRAIN",
        f"Reason=fabricwatch: incident-{nic.incident_id} nic_pause_storm"]
    assert congested is None


def test_api_scopes_approve_done_and_reject(client: TestClient, db: Engine) -> None:
    load_fabric(db, **SMALL)
    with db.begin() as conn:
        a = service.recommend(conn=conn, target=Target(kind=TargetKind.LINK, device="leaf-p1-r0-01",
                                                       port="Ethernet1/5"), reason="FEC", settings=settings())
        b = service.recommend(conn=conn, target=Target(kind=TargetKind.HOST, device="host-p1-00003"),
                              reason="NIC", settings=settings())
    read, op = _h(db, "read"), _h(db, "operate")
    listed = client.get("/api/v1/drains", params={"status": "pending"}, headers=read)
    assert listed.status_code == 200 and {d["id"] for d in listed.json()} == {a.id, b.id}
    one = client.get(f"/api/v1/drains/{a.id}", headers=read).json()
    assert one["verdict"]["safe"] and one["verdict"]["checks"]
    assert client.post(f"/api/v1/drains/{a.id}/approve", headers=read).status_code == 403
    r = client.post(f"/api/v1/drains/{a.id}/approve", json={"note": "go"}, headers=op)
    assert r.status_code == 200 and r.json()["status"] == "approved" and r.json()["decided_by"] == "operate-user"
    assert r.json()["execution"] is None   # executor off by default
    r = client.post(f"/api/v1/drains/{a.id}/done", headers=op)
    assert r.json()["status"] == "done" and r.json()["done_by"] == "operate-user"
    r = client.post(f"/api/v1/drains/{a.id}/reject", headers=op)
    assert r.status_code == 409 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["current"] == "done" and "cannot reject" in r.json()["detail"]
    r = client.post(f"/api/v1/drains/{b.id}/reject", json={"note": "job running"}, headers=op)
    assert r.json()["status"] == "rejected" and r.json()["decision_note"] == "job running"
    inc = client.get(f"/api/v1/incidents/{a.incident_id}", headers=read).json()
    assert inc["state"] == "drained" and [e["actor"] for e in inc["timeline"]][-1] == "operate-user"
    assert client.get(f"/api/v1/incidents/{b.incident_id}", headers=read).json()["state"] == "suspect"
    assert client.get("/api/v1/drains/999", headers=read).status_code == 404


def test_api_approval_refused_when_no_longer_safe(client: TestClient, db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    with db.begin() as conn:
        a, b = (service.recommend(conn=conn, target=Target(kind=TargetKind.LINK, device="leaf-p1-r0-01", port=p),
                                  reason="FEC", settings=s) for p in ("Ethernet1/5", "Ethernet1/6"))
        service.approve(conn=conn, drain_id=a.id, actor="x", settings=s)
    r = client.post(f"/api/v1/drains/{b.id}/approve", headers=_h(db, "operate"))
    assert r.status_code == 409 and r.json()["title"] == "Drain no longer safe"
    assert "leaf-p1-r0-01 would keep 2 of 4 uplinks, floor is 3" in r.json()["detail"]
    assert client.get(f"/api/v1/drains/{b.id}", headers=_h(db, "read")).json()["status"] == "blocked"


def test_api_breaker_state_and_attributed_reset(client: TestClient, db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings(breaker_max=1)
    with db.begin() as conn:
        for h in ("host-p1-00001", "host-p1-00002"):
            service.recommend(conn=conn, target=Target(kind=TargetKind.HOST, device=h), reason="x", settings=s)
    read, op = _h(db, "read"), _h(db, "operate")
    st = client.get("/api/v1/drains/breaker", headers=read).json()
    assert st["tripped"] and "limit is 1" in st["trip_reason"]
    assert client.post("/api/v1/drains/breaker/reset", headers=read).status_code == 403
    r = client.post("/api/v1/drains/breaker/reset", json={"note": "checked the fleet"}, headers=op).json()
    assert not r["tripped"] and r["reset_by"] == "operate-user" and r["reset_note"] == "checked the fleet"


def _storm(i: int, flaps: int, port: str = "Ethernet1/5") -> Finding:
    return Finding(kind="flap_storm", scope="link", device="leaf-p1-r0-01", port=port, lane=None,
                   cause=Cause.FLAP_STORM, severity=Severity.PAGE, action=Action.DISABLE_PORT, state="firing",
                   score=float(flaps), at_ms=int(AT.timestamp() * 1000) + i * 60_000,
                   summary=f"link flap storm on leaf-p1-r0-01:{port}: {flaps} flaps in one poll step")


def _cycle(db: Engine, i: int, *findings: Finding) -> CycleOutcome:
    with db.begin() as conn:
        return apply_cycle(conn, list(findings), int(AT.timestamp() * 1000) + i * 60_000)


def test_a_cleared_alert_withdraws_its_drain_which_cannot_be_approved(client: TestClient, db: Engine) -> None:
    load_fabric(db, **SMALL)
    read, op = _h(db, "read"), _h(db, "operate")
    _cycle(db, 0, _storm(0, 6))
    _cycle(db, 1, _storm(1, 0))  # still firing on the way down: the drain keeps the storm's reason
    (d,) = client.get("/api/v1/drains", headers=read).json()
    assert d["status"] == "pending" and d["reason"].endswith(": 6 flaps in one poll step")
    assert d["alert_state"] == "firing" and d["alert_id"] is not None
    for i in (2, 3):
        assert _cycle(db, i).withdrawn == []
    out = _cycle(db, 4)  # the third cycle without the finding resolves the alert
    assert out.changes.resolved == [d["alert_id"]] and out.withdrawn == [d["id"]]
    (d,) = client.get("/api/v1/drains", headers=read).json()
    assert (d["status"], d["alert_state"], d["decided_by"]) == ("withdrawn", "resolved", "fabricwatch")
    assert datetime.fromisoformat(d["decided_at"]) == AT + timedelta(minutes=4)  # data time, kept as history
    assert f"alert {d['alert_id']} (flap_storm/leaf-p1-r0-01:Ethernet1/5) resolved" in d["decision_note"]
    assert "6 flaps" in d["reason"]
    r = client.post(f"/api/v1/drains/{d['id']}/approve", headers=op)
    assert r.status_code == 409 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["current"] == "withdrawn" and "its finding cleared" in r.json()["detail"]
    assert client.get(f"/api/v1/incidents/{d['incident_id']}", headers=read).json()["state"] == "suspect"
    # firing again: a new episode, a new recommendation; the withdrawn one stays as it was
    _cycle(db, 5, _storm(5, 7))
    rows = client.get("/api/v1/drains", headers=read).json()
    assert [(x["status"], x["alert_state"]) for x in rows] == [("pending", "firing"), ("withdrawn", "firing")]


def test_approving_a_drain_whose_alert_was_resolved_by_hand_withdraws_it(client: TestClient, db: Engine) -> None:
    load_fabric(db, **SMALL)
    _cycle(db, 0, _storm(0, 6, "Ethernet1/6"))
    op = _h(db, "operate")
    (d,) = client.get("/api/v1/drains", headers=op).json()
    with db.begin() as conn:
        resolve(conn=conn, alert_id=d["alert_id"], actor="alice", comment="reseated")
    r = client.post(f"/api/v1/drains/{d['id']}/approve", headers=op)
    assert r.status_code == 409 and r.json()["title"] == "Drain withdrawn" and r.json()["alert_state"] == "resolved"
    assert "resolved" in r.json()["detail"] and "by alice" in r.json()["detail"]
    d = client.get(f"/api/v1/drains/{d['id']}", headers=op).json()
    assert d["status"] == "withdrawn" and d["decided_by"] == "operate-user"
