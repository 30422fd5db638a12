"""fabricwatch's own health in Prometheus terms, at /api/v1/metrics (a read token): open alerts per state,
severity and cause, one fault series per open alert (capped), receivers' backlog, the detector's last cycle;
and on both it and the open /metrics, targets that are not ok per reason. Read from the database at scrape
time, so what the workers changed shows at the next scrape. The open /metrics names no device or port."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from service import observability
from service.alerts import service as alerts
from service.alerts.service import apply_findings
from service.auth.service import create_token
from service.detection.findings import Cause, Severity
from service.notify import NotifySettings, alertmanager
from service.notify.destinations import create_destination
from service.notify.outbox import deliver_due
from service.notify.schemas import AlertmanagerSettings
from service.notify.service import create_subscription
from tests.alerts import T0, finding
from tests.alerts.test_api import make_app
from tests.live_api import free_tcp_port

FAST = NotifySettings(allow=("127.0.0.0/8",), timeout_s=1.0, backoff_base_s=30, backoff_max_s=60)


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    with TestClient(make_app(db_url, auth_required=False)) as c:
        yield c


def scrape(client: TestClient) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(client.get("/api/v1/metrics").text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lbl, v in m.get(name, []) if lbl == labels]
    assert len(hits) == 1, f"{name}{labels}: {m.get(name)}"
    return hits[0]


def test_alert_states_causes_and_faults(db: Engine, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    m = scrape(client)   # nothing open: every state x severity and cause x severity is there, at 0
    assert value(m, "fabricwatch_alerts_open", state="firing", severity="page") == 0
    assert len(m["fabricwatch_alerts_open_by_cause"]) == len(Cause) * 3
    assert m.get("fabricwatch_fault_info", []) == []

    with db.begin() as conn:   # leaf-03 is silenced in fabricwatch: open, but muted
        alerts.create_silence(conn=conn, matchers=[{"name": "device", "value": "leaf-03", "is_regex": False,
                                                    "is_equal": True}],
                              starts_at=datetime.fromtimestamp(T0 / 1000 - 60, UTC),
                              ends_at=datetime.fromtimestamp(T0 / 1000 + 3600, UTC), created_by="t", comment="x")
        cs = apply_findings(conn=conn, at_ms=T0, findings=[
            finding(device="leaf-01", port="Ethernet1/1"),
            finding(device="leaf-01", port="Ethernet2/1", kind="pause_storm", cause=Cause.NIC_PAUSE_STORM,
                    severity=Severity.TICKET),
            finding(device="leaf-02", port="Ethernet9/1", cause=Cause.FIBER),
            finding(device="leaf-03", port="Ethernet4/1")])
        alerts.acknowledge(conn=conn, alert_id=cs.opened[2], actor="alice")

    m = scrape(client)
    assert value(m, "fabricwatch_alerts_open", state="firing", severity="page") == 2
    assert value(m, "fabricwatch_alerts_open", state="acknowledged", severity="page") == 1
    assert value(m, "fabricwatch_alerts_open", state="firing", severity="ticket") == 1
    assert value(m, "fabricwatch_alerts_open_by_cause", cause="connector_contamination", severity="page") == 2
    assert value(m, "fabricwatch_alerts_open_by_cause", cause="fiber_damage", severity="page") == 1
    assert value(m, "fabricwatch_alerts_open_by_cause", cause="nic_pause_storm", severity="ticket") == 1
    assert value(m, "fabricwatch_alerts_muted", severity="page") == 1
    assert value(m, "fabricwatch_devices_with_open_alerts", severity="page") == 3
    assert value(m, "fabricwatch_devices_with_open_alerts", severity="ticket") == 1
    faults = {(lbl["device"], lbl["port"]): lbl for lbl, v in m["fabricwatch_fault_info"] if v == 1}
    assert set(faults) == {("leaf-01", "Ethernet1/1"), ("leaf-01", "Ethernet2/1"), ("leaf-02", "Ethernet9/1"),
                           ("leaf-03", "Ethernet4/1")}
    assert faults[("leaf-02", "Ethernet9/1")] == {"device": "leaf-02", "port": "Ethernet9/1", "pod": "",
                                                  "kind": "rx_power_degrading", "cause": "fiber_damage",
                                                  "severity": "page", "state": "acknowledged"}
    assert value(m, "fabricwatch_fault_info_omitted") == 0

    # Bounded: past the limit the worst are listed (pages first) and the rest counted.
    monkeypatch.setattr(observability, "FAULT_SERIES_MAX", 2)
    m = scrape(client)
    listed = m["fabricwatch_fault_info"]
    assert len(listed) == 2 and {lbl["severity"] for lbl, _ in listed} == {"page"}
    assert value(m, "fabricwatch_fault_info_omitted") == 2

    with db.begin() as conn:   # resolved alerts leave the gauges
        for alert_id in cs.opened:
            alerts.resolve(conn=conn, alert_id=alert_id, actor="alice")
    m = scrape(client)
    assert value(m, "fabricwatch_alerts_open", state="firing", severity="page") == 0
    assert m.get("fabricwatch_fault_info", []) == []


def test_targets_not_ok_per_reason_and_receivers_backlog(db: Engine, client: TestClient) -> None:
    with db.begin() as conn:
        for name, proto, status in (("leaf-01", "snmp", None), ("leaf-02", "snmp", "failing"),
                                    ("host-01", "host", "empty")):
            dev = conn.execute(text("INSERT INTO devices (name, kind, role, gpus) VALUES (:n, :k, :r, 0) RETURNING id"),
                               {"n": name, "k": "host" if proto == "host" else "switch",
                                "r": "host" if proto == "host" else "leaf"}).scalar_one()
            ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                                   "VALUES (:d, :p, '127.0.0.1', '{}') RETURNING id"),
                              {"d": dev, "p": proto}).scalar_one()
            if status:
                conn.execute(text("INSERT INTO target_status (endpoint_id, last_attempt, last_error, samples, "
                                  "consecutive_failures) VALUES (:e, now(), :err, 0, :f)"),
                             {"e": ep, "err": "timeout" if status == "failing" else None,
                              "f": 2 if status == "failing" else 0})
        apply_findings(conn=conn, at_ms=T0, findings=[finding(device="leaf-01")])
    m = scrape(client)
    assert value(m, "fabricwatch_targets_not_ok", protocol="snmp", reason="never_polled") == 1
    assert value(m, "fabricwatch_targets_not_ok", protocol="snmp", reason="collection_failing") == 1
    assert value(m, "fabricwatch_targets_not_ok", protocol="host", reason="nothing_stored") == 1
    assert value(m, "fabricwatch_targets_not_ok", protocol="gnmi", reason="group_missing") == 0

    # Receivers: a webhook and an Alertmanager that are both down. The alert opened before they were added:
    # the Alertmanager is seeded with it, the webhook gets nothing (it was not subscribed at the time).
    dead = f"http://127.0.0.1:{free_tcp_port()}"
    with db.begin() as conn:
        create_subscription(conn=conn, name="noc", url=dead + "/hook", format="generic", secret=None,
                            routing_key=None, filters={}, send_resolved=True, enabled=True, created_by="t",
                            settings=FAST)
        create_destination(conn=conn, name="am-1", url=dead, filters={}, enabled=True, created_by="t", settings=FAST)
        apply_findings(conn=conn, at_ms=T0 + 60_000, findings=[finding(device="leaf-01"), finding(device="leaf-02")])
    m = scrape(client)
    assert value(m, "fabricwatch_notify_pending", kind="webhook", receiver="noc") == 1
    assert value(m, "fabricwatch_notify_pending", kind="alertmanager", receiver="am-1") == 2
    assert value(m, "fabricwatch_alertmanager_firing", receiver="am-1") == 2
    assert "fabricwatch_alertmanager_up" not in m   # never tried: neither up nor down
    deliver_due(db, settings=FAST)
    alertmanager.deliver(db, settings=AlertmanagerSettings(timeout_s=1), notify=FAST, budget_s=5)
    m = scrape(client)
    assert value(m, "fabricwatch_alertmanager_up", receiver="am-1") == 0
    assert value(m, "fabricwatch_notify_pending", kind="alertmanager", receiver="am-1") == 2
    assert value(m, "fabricwatch_notify_dead", receiver="noc") == 0
    assert value(m, "fabricwatch_notify_oldest_pending_seconds", kind="webhook", receiver="noc") > 0


def test_the_detectors_last_cycle(db: Engine, client: TestClient) -> None:
    assert "fabricwatch_detection_last_cycle_timestamp_seconds" not in scrape(client)   # never ran: no series
    with db.begin() as conn:
        conn.execute(text("INSERT INTO detector_state (name, watermark_ms, last_cycle_ms, ports, saved_at, blob) "
                          "VALUES ('default', :t, :t, 4, to_timestamp(1796140000), '')"), {"t": T0})
    m = scrape(client)
    assert value(m, "fabricwatch_detection_last_cycle_timestamp_seconds") == 1796140000
    assert value(m, "fabricwatch_detection_data_timestamp_seconds") == T0 / 1000


def test_fabric_series_need_a_read_token_and_stay_off_the_open_metrics(db: Engine, db_url: str) -> None:
    with db.begin() as conn:
        apply_findings(conn=conn, findings=[finding(device="leaf-01", port="Ethernet1/1")], at_ms=T0)
        read = create_token(conn, name="prometheus", scopes=["read"])
        ingest = create_token(conn, name="agent", scopes=["ingest"])
    with TestClient(make_app(db_url, auth_required=True)) as c:
        assert c.get("/api/v1/metrics").status_code == 401
        assert c.get("/api/v1/metrics", headers={"authorization": f"Bearer {ingest}"}).status_code == 403
        r = c.get("/api/v1/metrics", headers={"authorization": f"Bearer {read}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert re.search(r'^fabricwatch_fault_info\{[^}]*device="leaf-01"[^}]*port="Ethernet1/1"', r.text, re.M)
        assert "fabricwatch_http_request_seconds" in r.text and "fabricwatch_targets_not_ok" in r.text
        open_ = c.get("/metrics")
        assert open_.status_code == 200 and "fabricwatch_targets_not_ok" in open_.text
        assert "leaf-01" not in open_.text and "fabricwatch_alerts_open" not in open_.text
