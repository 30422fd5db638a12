"""Incident state machine, attributed timeline, verification soak gate and live precision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.api import auth
from service.auth.service import create_token
from service.incidents import service
from service.incidents.schemas import IncidentSettings
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from tests.drains import SMALL, load_fabric
from tests.drains.test_api import make_app

END = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
FAULT = END - timedelta(days=1)
SOAK = IncidentSettings(window_s=3600, rx_power_tolerance_db=1.0, baseline_window_s=7200, min_coverage=0.9)
A, B = ("leaf-p1-r0-01", "Ethernet1/5"), ("spine-01", "Ethernet1/1")


def _open(db: Engine, **kw: object) -> int:
    args: dict[str, object] = {"kind": "link", "device": A[0], "port": A[1], "peer_device": B[0],
                               "peer_port": B[1], "cause": "connector_contamination", "at": FAULT}
    args.update(kw)
    with db.begin() as conn:
        row, created = service.open_or_get(conn=conn, **args)  # type: ignore[arg-type]
        assert created
        return row.id


def _walk(db: Engine, incident_id: int, *states: str) -> None:
    with db.begin() as conn:
        for s in states:
            service.transition(conn=conn, incident_id=incident_id, to=s, actor="tech", at=FAULT + timedelta(hours=1))


def test_illegal_transitions_name_current_attempted_and_allowed(db: Engine) -> None:
    load_fabric(db, **SMALL)
    iid = _open(db)
    with db.begin() as conn, pytest.raises(service.IllegalTransition) as exc:
        service.transition(conn=conn, incident_id=iid, to="verifying", actor="tech")
    assert str(exc.value) == (f"incident {iid} is 'suspect'; cannot go to 'verifying'; "
                              "allowed: drain_recommended, drained, closed, false_alarm")
    _walk(db, iid, "false_alarm")
    with db.begin() as conn, pytest.raises(service.IllegalTransition, match="allowed: none"):
        service.transition(conn=conn, incident_id=iid, to="suspect", actor="tech")
    with db.begin() as conn, pytest.raises(service.IncidentNotFound):
        service.transition(conn=conn, incident_id=9999, to="closed", actor="tech")


def test_one_open_incident_per_entity(db: Engine) -> None:
    load_fabric(db, **SMALL)
    iid = _open(db)
    with db.begin() as conn:   # the same link named from its other end
        row, created = service.open_or_get(conn=conn, kind="link", device=B[0], port=B[1], peer_device=A[0],
                                           peer_port=A[1], alert_id=7)
    assert not created and row.id == iid and row.alert_id == 7
    _walk(db, iid, "closed")
    assert _open(db) != iid   # a closed incident does not absorb a new fault


def _series(ts0: datetime, minutes: int, value, metric: str, end: tuple[str, str], lane: int | None = None):  # type: ignore[no-untyped-def]
    return [Sample(metric, value(i), int((ts0 + timedelta(minutes=i)).timestamp() * 1000), end[0], end[1], lane)
            for i in range(minutes + 1)]


def _telemetry(db: Engine, *, fec_jump: float = 0, flap: float = 0, rx_now: float = -2.3,
               minutes: int = 70) -> None:
    """Baseline rx power before the fault; counters and rx power over the soak window ending at END."""
    start = END - timedelta(minutes=minutes)
    rows: list[Sample] = []
    for end in (A, B):
        for lane in range(4):
            rows += _series(FAULT - timedelta(hours=1), 50, lambda i: -2.0, "optic_rx_power_dbm", end, lane)
            now = rx_now if end == A else -2.0
            rows += _series(start, minutes, lambda i, v=now: v, "optic_rx_power_dbm", end, lane)
        jump = fec_jump if end == A else 0
        rows += _series(start, minutes, lambda i, j=jump: 100 + (j if i > minutes - 5 else 0),
                        "port_fec_uncorrectable_codewords_total", end)
        rows += _series(start, minutes, lambda i: 7, "port_symbol_errors_total", end)
        rows += _series(start, minutes, lambda i, f=flap if end == B else 0: 2 + (f if i > 30 else 0),
                        "port_link_down_events_total", end)
    ingest_samples(engine=db, samples=rows)


def _to_verifying(db: Engine) -> int:
    iid = _open(db)
    _walk(db, iid, "drained", "in_repair", "verifying")
    return iid


def _return(db: Engine, iid: int):  # type: ignore[no-untyped-def]
    with db.begin() as conn:
        return service.transition(conn=conn, incident_id=iid, to="returned_to_service", actor="tech", at=END,
                                  settings=SOAK)


def test_soak_allows_a_clean_link(db: Engine) -> None:
    load_fabric(db, **SMALL)
    iid = _to_verifying(db)
    _telemetry(db)
    row = _return(db, iid)
    assert row.state == "returned_to_service" and row.closed_at == END
    with db.connect() as conn:
        last = service.timeline(conn=conn, incident_id=iid)[-1]
    assert last.to_state == "returned_to_service" and last.data["soak"]["clean"]
    rx = [c for c in last.data["soak"]["checks"] if c["check"] == "rx_power" and c["subject"].startswith(A[0])]
    assert len(rx) == 4 and rx[0]["numbers"]["delta_db"] == -0.3


@pytest.mark.parametrize(("kw", "expect"), [
    ({"fec_jump": 5}, "leaf-p1-r0-01:Ethernet1/5 port_fec_uncorrectable_codewords_total +5 in the soak window"),
    ({"flap": 1}, "spine-01:Ethernet1/1 port_link_down_events_total +1 in the soak window"),
    ({"rx_now": -3.6}, "leaf-p1-r0-01:Ethernet1/5:lane0 rx -3.60 dBm vs baseline -2.00 dBm (-1.60 dB, "
                       "tolerance ±1 dB)"),
    ({"minutes": 20}, "leaf-p1-r0-01:Ethernet1/5 error counters cover 20.0 of 60.0 min, need 54.0"),
])
def test_soak_refuses_with_numbers(db: Engine, kw: dict[str, float], expect: str) -> None:
    load_fabric(db, **SMALL)
    iid = _to_verifying(db)
    _telemetry(db, **kw)
    with pytest.raises(service.SoakNotClean) as exc:
        _return(db, iid)
    assert not exc.value.report.clean
    assert expect in [c.message for c in exc.value.report.checks if not c.ok]
    assert expect in str(exc.value) or expect in exc.value.report.summary
    with db.connect() as conn:
        assert service.get(conn=conn, incident_id=iid).state == "verifying"


def test_soak_refuses_without_data(db: Engine) -> None:
    load_fabric(db, **SMALL)
    iid = _to_verifying(db)
    with pytest.raises(service.SoakNotClean, match="error counters cover 0.0 of 60.0 min"):
        _return(db, iid)


def test_precision_per_cause_and_part_number(db: Engine) -> None:
    load_fabric(db, **SMALL)
    cases = [("connector_contamination", "PN-A", "yes"), ("connector_contamination", "PN-A", "yes"),
             ("connector_contamination", "PN-B", "no"), ("transmitter_wearout", "PN-B", "yes"),
             ("transmitter_wearout", "PN-B", "unknown")]
    for i, (cause, pn, bad) in enumerate(cases, start=1):
        iid = _open(db, device=f"host-p1-0000{i % 4 + 1}", port=f"eth{i // 4}", peer_device=None, peer_port=None,
                    kind="port", cause=cause, part_number=pn)
        _walk(db, iid, "drained")
        with db.begin() as conn:
            service.record_outcome(conn=conn, incident_id=iid, actor="tech", repair_action="cleaned", part_bad=bad)
    fa = _open(db, kind="host", device="host-p1-00001", cause="transmitter_wearout", part_number="PN-C")
    _walk(db, fa, "false_alarm")
    with db.connect() as conn:
        p = service.precision(conn=conn)
    cause = {r.key: r for r in p.by_cause}
    assert (cause["connector_contamination"].confirmed, cause["connector_contamination"].refuted) == (2, 1)
    assert cause["connector_contamination"].precision == pytest.approx(2 / 3, abs=1e-4)
    tw = cause["transmitter_wearout"]
    assert (tw.confirmed, tw.refuted, tw.unknown, tw.precision) == (1, 1, 1, 0.5)
    part = {r.key: r for r in p.by_part_number}
    assert part["PN-A"].precision == 1.0 and part["PN-B"].precision == 0.5 and part["PN-C"].precision == 0.0


def test_api_transitions_notes_owner_outcome(db: Engine, db_url: str) -> None:
    load_fabric(db, **SMALL)
    auth._failures.clear()
    client = TestClient(make_app(db_url))
    with db.begin() as conn:
        op = {"authorization": f"Bearer {create_token(conn, name='noc-alice', scopes=['operate'])}"}
        read = {"authorization": f"Bearer {create_token(conn, name='viewer', scopes=['read'])}"}
    iid = _open(db)
    r = client.post(f"/api/v1/incidents/{iid}/transitions", json={"to": "in_repair"}, headers=op)
    assert r.status_code == 409 and r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert (body["current"], body["attempted"]) == ("suspect", "in_repair")
    assert body["allowed"] == ["drain_recommended", "drained", "closed", "false_alarm"]
    assert client.post(f"/api/v1/incidents/{iid}/notes", json={"text": "x"}, headers=read).status_code == 403
    assert client.post(f"/api/v1/incidents/{iid}/notes", json={"text": "optic dusty"}, headers=op).status_code == 201
    assert client.put(f"/api/v1/incidents/{iid}/owner", json={"owner": "alice"}, headers=op).json()["owner"] == "alice"
    assert client.post(f"/api/v1/incidents/{iid}/outcome", json={"repair_action": "cleaned", "part_bad": "yes"},
                       headers=op).status_code == 409   # nothing done yet on a suspect
    for to in ("drained", "in_repair", "verifying"):
        assert client.post(f"/api/v1/incidents/{iid}/transitions", json={"to": to}, headers=op).status_code == 200
    r = client.post(f"/api/v1/incidents/{iid}/transitions", json={"to": "returned_to_service",
                                                                  "at": END.isoformat()}, headers=op)
    assert r.status_code == 409 and r.json()["title"] == "Verification soak not clean"
    assert r.json()["soak"]["checks"]
    r = client.post(f"/api/v1/incidents/{iid}/outcome", json={"repair_action": "cleaned", "part_bad": "yes",
                                                               "note": "ferrule cleaned"}, headers=op)
    assert r.status_code == 200 and r.json()["outcome_by"] == "noc-alice"
    detail = client.get(f"/api/v1/incidents/{iid}", headers=read).json()
    assert detail["allowed_transitions"] == ["returned_to_service", "in_repair"]
    kinds = [(e["kind"], e["actor"]) for e in detail["timeline"]]
    assert kinds == [("created", "fabricwatch"), ("note", "noc-alice"), ("owner", "noc-alice"),
                     ("transition", "noc-alice"), ("transition", "noc-alice"), ("transition", "noc-alice"),
                     ("outcome", "noc-alice")]
    assert all(e["ts"] for e in detail["timeline"])
    listed = client.get("/api/v1/incidents", params={"open": "true", "owner": "alice"}, headers=read).json()
    assert [i["id"] for i in listed] == [iid]
    prec = client.get("/api/v1/incidents/precision", headers=read).json()
    assert prec["by_cause"] == [{"key": "connector_contamination", "confirmed": 1, "refuted": 0, "unknown": 0,
                                 "precision": 1.0}]
    soak = client.get(f"/api/v1/incidents/{iid}/soak", params={"at": END.isoformat()}, headers=read).json()
    assert soak["clean"] is False
