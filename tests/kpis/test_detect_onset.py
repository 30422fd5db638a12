"""Time to detect is measured only from an onset recorded before the alert. The detection pipeline opens its
incidents together with the alert, so its incidents have no detect time: the recovery report must say
unknown (None), not "0 s", while mitigate is still measured."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from service.db import session_scope
from service.detection.findings import Action, Cause, Evidence, Finding, Severity
from service.incidents import service as incidents
from service.incidents.schemas import State
from service.inventory.service import upsert_inventory
from service.kpis.service import load_timelines, recovery_times
from service.pipeline import apply_cycle
from simulator.topology import build_topology
from tests.api.fabric_seed import FAULTY_LEAF, FAULTY_PORT, params

AT = datetime(2026, 1, 1, 0, 30, tzinfo=UTC)


def test_pipeline_incidents_have_no_detect_time(db: Engine) -> None:
    with session_scope(db) as session:
        upsert_inventory(session=session, inventory=build_topology(params()))
    at_ms = int(AT.timestamp() * 1000)
    finding = Finding(kind="rx_power_low", scope="lane", device=FAULTY_LEAF, port=FAULTY_PORT, lane=1,
                      cause=Cause.CONTAMINATION, severity=Severity.PAGE, action=Action.CLEAN, state="firing",
                      score=6.0, at_ms=at_ms, summary="Rx power on lane 1 fell 6 dB in one step",
                      peer_device="host-p1-00001", peer_port="eth0", end="local",
                      evidence=[Evidence("rx_power_dbm", -7.1, baseline=-1.1, unit="dBm")])
    with db.begin() as conn:
        out = apply_cycle(conn, [finding], at_ms)   # alert, incident and drain recommendation, as live
        assert out.changes.opened and out.drains
        inc_id = conn.exec_driver_sql("SELECT id FROM incidents").scalar_one()
        incidents.transition(conn=conn, incident_id=inc_id, to=State.DRAINED, actor="noc",
                             at=AT + timedelta(minutes=3))
        tls = load_timelines(conn=conn, start=AT - timedelta(days=1), end=AT + timedelta(days=1))
    assert [(t.onset, t.first_alert) for t in tls] == [(None, AT)]
    rep = recovery_times(tls)
    g = rep.by_cause["connector_contamination"]
    assert g.detect.count == 0 and g.detect.p50 is None      # was 0.0: the alert time taken for the onset
    assert g.mitigate.p50 == 180.0
