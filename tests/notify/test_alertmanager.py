"""Alertmanager as a destination, against the real Alertmanager on 127.0.0.1: what it holds (its own
GET /api/v2/alerts), what it pages (its webhook receiver, a real HTTP server), a silence set in it, a
resolve, re-sends keeping endsAt ahead, an escalation, and an Alertmanager that is down for a while."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from service.alerts import service as alerts
from service.alerts.service import apply_findings
from service.detection.findings import Cause, Severity
from service.notify import NotifySettings, alertmanager
from service.notify.destinations import create_destination, notify_status, update_destination
from service.notify.outbox import deliver_due
from service.notify.schemas import AlertmanagerSettings
from service.notify.service import create_subscription
from tests.alertmanager_peer import Alertmanager, require_alertmanager
from tests.alerts import STEP, T0, finding
from tests.receiver import Receiver

FAST = NotifySettings(allow=("127.0.0.0/8",), timeout_s=2.0, backoff_base_s=0.05, backoff_max_s=0.3)
AM = AlertmanagerSettings(resend_s=60, ends_after_s=240, timeout_s=2.0, backoff_base_s=0.2, backoff_max_s=0.5,
                          external_labels={"source": "fabricwatch"}, runbook_url="https://wiki.example/fabric/{cause}")


@pytest.fixture()
def hook() -> Iterator[Receiver]:
    """Alertmanager's own webhook receiver: what would page someone."""
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture()
def am(tmp_path: Path, hook: Receiver) -> Iterator[Alertmanager]:
    require_alertmanager()
    peer = Alertmanager(tmp_path, hook.url + "/am").start()
    yield peer
    peer.stop()


def add_destination(db: Engine, url: str, name: str = "am", **filters: list[str]) -> int:
    with db.begin() as conn:
        return create_destination(conn=conn, name=name, url=url, filters=filters, enabled=True,
                                  created_by="test", settings=FAST)["id"]


def inventory(db: Engine) -> None:
    """leaf-01 and host-07 in pod-a; host-07's eth3 (rail 3) is cabled to leaf-01 Ethernet1/1."""
    with db.begin() as conn:
        ids = {}
        for name, kind in (("leaf-01", "switch"), ("leaf-02", "switch"), ("host-07", "host")):
            ids[name] = conn.execute(text("INSERT INTO devices (name, kind, role, pod, gpus) VALUES "
                                          "(:n, :k, :r, 'pod-a', 0) RETURNING id"),
                                     {"n": name, "k": kind, "r": "leaf" if kind == "switch" else "host"}).scalar_one()
        conn.execute(text("INSERT INTO ports (device_id, name, rail) VALUES (:d, :p, :r)"),
                     [{"d": ids["leaf-01"], "p": "Ethernet1/1", "r": None},
                      {"d": ids["host-07"], "p": "eth3", "r": 3}])


def cycle(db: Engine, findings: list[Any], n: int, **kw: Any) -> alerts.ChangeSet:
    with db.begin() as conn:
        return apply_findings(conn=conn, findings=findings, at_ms=T0 + n * STEP, **kw)


def push(db: Engine, settings: AlertmanagerSettings = AM) -> dict[str, int]:
    return alertmanager.deliver(db, settings=settings, notify=FAST, budget_s=10)


LONG_BACKOFF = AlertmanagerSettings(timeout_s=2, backoff_base_s=30, backoff_max_s=60)


def backoff_over(db: Engine) -> None:
    """The destinations' backoff has run out (the tests do not wait for it: a loaded machine would race it)."""
    with db.begin() as conn:
        conn.execute(text("UPDATE alertmanager_destinations SET retry_at = now() WHERE retry_at IS NOT NULL"))


def ours(alerts_: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["labels"]["device"]: a for a in alerts_}


def pages(hook: Receiver) -> list[dict[str, Any]]:
    """Every alert Alertmanager's webhook notifications carried, with the notification's status."""
    return [dict(a, notification=json.loads(r.body)["status"]) for r in hook.bodies("/am")
            for a in json.loads(r.body)["alerts"]]


def test_alerts_reach_alertmanager_with_routing_labels_and_annotations_and_resolve(
        db: Engine, am: Alertmanager, hook: Receiver) -> None:
    inventory(db)
    add_destination(db, am.url)
    opened = cycle(db, [finding(device="leaf-01", port="Ethernet1/1", peer_device="host-07", peer_port="eth3",
                                end="local")], 0).opened
    with db.begin() as conn:  # the pipeline recommended a drain for it
        drain_id = conn.execute(text(
            "INSERT INTO drain_recommendations (alert_id, target_kind, target, device, port, action, status, "
            "verdict, created_at, updated_at) VALUES (:a, 'port', 'leaf-01:Ethernet1/1', 'leaf-01', "
            "'Ethernet1/1', 'shut_ports', 'pending', '{}', now(), now()) RETURNING id"), {"a": opened[0]}).scalar_one()
    sent_at = datetime.now(UTC)
    assert push(db)["delivered"] == 1

    (held,) = am.wait_alerts(lambda a: len(a) == 1)
    assert held["labels"] == {"source": "fabricwatch", "alertname": "rx_power_degrading", "device": "leaf-01",
                              "port": "Ethernet1/1",
                              "peer_device": "host-07", "peer_port": "eth3", "pod": "pod-a", "rail": "3",
                              "severity": "page", "cause": "connector_contamination", "scope": "port"}
    ann = held["annotations"]
    assert ann["summary"] == "rx_power_degrading on leaf-01 Ethernet1/1"
    assert json.loads(ann["evidence"])[0]["feature"] == "rx_power_dbm"
    assert ann["action"] == "clean_connectors" and "clean" in ann["runbook"].lower()
    assert ann["runbook_url"] == "https://wiki.example/fabric/connector_contamination"
    assert ann["drain"] == f"drain {drain_id} (pending, shut_ports)"
    assert ann["drain_url"].endswith(f"/api/v1/drains/{drain_id}")
    assert ann["fabricwatch_alert"].endswith(f"/api/v1/alerts/{opened[0]}")
    starts = datetime.fromisoformat(held["startsAt"])
    ends = datetime.fromisoformat(held["endsAt"])
    assert starts == datetime.fromtimestamp(T0 / 1000, UTC)   # the episode's opening (data time)
    # endsAt is ahead by ends_after_s: several resends may be missed before Alertmanager resolves it alone
    assert sent_at + timedelta(seconds=AM.ends_after_s - 5) < ends < sent_at + timedelta(seconds=AM.ends_after_s + 5)
    assert held["status"]["state"] == "active"

    hook.wait_for(1, path="/am")
    (page,) = pages(hook)
    assert page["notification"] == "firing" and page["labels"]["device"] == "leaf-01"

    # It clears (after the cause's 30 min hold-down) and the resolve reaches Alertmanager.
    assert cycle(db, [], 31, clear_cycles=1).resolved == opened
    assert push(db)["delivered"] == 1
    am.wait_alerts(lambda a: a == [])  # no longer active there
    hook.wait_for(2, path="/am")
    assert [p["notification"] for p in pages(hook)] == ["firing", "resolved"]
    assert pages(hook)[1]["labels"] == held["labels"]
    assert push(db) == {}   # a delivered resolve is never sent again


def test_a_silence_in_alertmanager_mutes_the_page(db: Engine, am: Alertmanager, hook: Receiver) -> None:
    am.silence({"device": "leaf-02"}, comment="leaf-02 under repair")
    add_destination(db, am.url)
    cycle(db, [finding(device="leaf-01"), finding(device="leaf-02")], 0)
    push(db)
    held = ours(am.wait_alerts(lambda a: len(a) == 2))
    assert held["leaf-02"]["status"]["state"] == "suppressed" and held["leaf-02"]["status"]["silencedBy"]
    assert held["leaf-01"]["status"]["state"] == "active"
    hook.wait_for(1, path="/am")
    time.sleep(1.0)  # more than group_wait + group_interval: a page for leaf-02 would have come by now
    assert {p["labels"]["device"] for p in pages(hook)} == {"leaf-01"}


def test_firing_alerts_are_sent_again_with_endsat_moving_ahead(db: Engine, am: Alertmanager) -> None:
    quick = AlertmanagerSettings(resend_s=3.5, ends_after_s=4, timeout_s=2)
    add_destination(db, am.url)
    cycle(db, [finding()], 0)
    push(db, quick)
    first = datetime.fromisoformat(am.wait_alerts(lambda a: len(a) == 1)[0]["endsAt"])
    assert push(db, quick) == {}   # not due before resend_s
    with db.begin() as conn:   # resend_s later
        conn.execute(text("UPDATE alertmanager_outbox SET next_attempt_at = now()"))
    time.sleep(0.5)
    assert push(db, quick)["delivered"] == 1
    second = datetime.fromisoformat(am.wait_alerts(lambda a: len(a) == 1)[0]["endsAt"])
    assert second > first + timedelta(seconds=0.4)
    # Without re-sends Alertmanager resolves it by itself at endsAt (fabricwatch gone: no alert stuck firing).
    am.wait_alerts(lambda a: a == [], timeout_s=15)


def test_an_escalation_resolves_the_old_label_set_and_fires_the_new(db: Engine, am: Alertmanager) -> None:
    add_destination(db, am.url)
    cycle(db, [finding(severity=Severity.TICKET)], 0)
    push(db)
    am.wait_alerts(lambda a: [x["labels"]["severity"] for x in a] == ["ticket"])
    cycle(db, [finding(severity=Severity.PAGE)], 1)   # severity_changed: a new trigger
    push(db)
    held = am.wait_alerts(lambda a: [x["labels"]["severity"] for x in a] == ["page"])
    assert held[0]["labels"]["alertname"] == "rx_power_degrading"
    # The cause is refined without a notification in fabricwatch: the next re-send swaps the label sets.
    cycle(db, [finding(severity=Severity.PAGE, cause=Cause.FIBER)], 2)
    assert push(db) == {}   # nothing notified, nothing due
    with db.begin() as conn:   # resend_s later
        conn.execute(text("UPDATE alertmanager_outbox SET next_attempt_at = now()"))
    assert push(db)["alerts"] == 2   # the old set resolved, the new one firing
    held = am.wait_alerts(lambda a: [x["labels"]["cause"] for x in a] == ["fiber_damage"])
    assert held[0]["labels"]["severity"] == "page"


def test_filters_and_fabricwatch_mutes_decide_what_goes_out_and_a_new_destination_gets_what_fires(
        db: Engine, am: Alertmanager) -> None:
    with db.begin() as conn:  # a fabricwatch silence on leaf-03: no trigger goes out, to webhooks or Alertmanager
        alerts.create_silence(conn=conn, matchers=[{"name": "device", "value": "leaf-03", "is_regex": False,
                                                    "is_equal": True}],
                              starts_at=datetime.fromtimestamp(T0 / 1000 - 60, UTC),
                              ends_at=datetime.fromtimestamp(T0 / 1000 + 3600, UTC), created_by="t", comment="x")
    cycle(db, [finding(device="leaf-01"), finding(device="leaf-02", severity=Severity.TICKET),
               finding(device="leaf-03")], 0)
    add_destination(db, am.url, severity=["page"])   # added after the alerts opened: seeded with what fires
    push(db)
    assert set(ours(am.wait_alerts(lambda a: len(a) >= 1))) == {"leaf-01"}


def test_alertmanager_down_then_back_nothing_lost_and_webhooks_unaffected(
        db: Engine, am: Alertmanager, hook: Receiver, tmp_path: Path) -> None:
    webhook = Receiver().start()
    try:
        with db.begin() as conn:
            create_subscription(conn=conn, name="noc", url=webhook.url + "/hook", format="generic", secret=None,
                                routing_key=None, filters={}, send_resolved=True, enabled=True, created_by="t",
                                settings=FAST)
        dest = add_destination(db, am.url)
        am.stop()   # down before anything happens
        ids = cycle(db, [finding(device=f"leaf-0{i}") for i in (1, 2, 3)], 0).opened
        with db.begin() as conn:
            alerts.resolve(conn=conn, alert_id=ids[2], actor="alice")
        # Webhooks go out meanwhile, on their own outbox: 3 firing and a resolve.
        deliver_due(db, settings=FAST)
        assert len(webhook.wait_for(4, path="/hook")) == 4

        got = push(db, LONG_BACKOFF)
        assert got["failed"] == 1 and got.get("delivered", 0) == 0
        with db.connect() as conn:
            (st,) = notify_status(conn=conn)["alertmanagers"]
        assert st["state"] == "failing" and st["failures"] == 1 and "ConnectError" in st["last_error"]
        assert st["pending"] == 3 and st["firing"] == 2 and st["retry_at"] is not None
        assert push(db, LONG_BACKOFF) == {}   # backing off: not even tried
        backoff_over(db)
        assert push(db)["failed"] == 1   # tried again after the backoff, still down
        with db.connect() as conn:
            assert notify_status(conn=conn)["alertmanagers"][0]["failures"] == 2

        am.start()
        # More changes while it was down are in the same state rows: an ack of alert 0 (annotations say who).
        with db.begin() as conn:
            alerts.acknowledge(conn=conn, alert_id=ids[0], actor="bob")
        backoff_over(db)
        assert push(db)["delivered"] == 3
        held = ours(am.wait_alerts(lambda a: len(a) == 2))
        assert set(held) == {"leaf-01", "leaf-02"}
        assert held["leaf-01"]["annotations"]["acknowledged_by"] == "bob"
        with db.connect() as conn:
            (st,) = notify_status(conn=conn)["alertmanagers"]
            rows = list(conn.execute(text("SELECT alert_id, status, version, sent_version FROM alertmanager_outbox "
                                          "WHERE destination_id = :d ORDER BY alert_id"), {"d": dest}))
        assert st["state"] == "ok" and st["failures"] == 0 and st["pending"] == 0 and st["last_error"] is None
        assert [(r.alert_id, r.status) for r in rows] == [(ids[0], "firing"), (ids[1], "firing"), (ids[2], "resolved")]
        assert all(r.sent_version == r.version for r in rows)   # every change accepted: nothing lost
        deliver_due(db, settings=FAST)
        assert len(webhook.wait_for(5, path="/hook")) == 5   # the ack went to the webhook too
    finally:
        webhook.stop()


def test_an_alertmanager_that_refuses_is_failing_with_its_answer_and_gets_it_later(db: Engine) -> None:
    fake = Receiver().start()   # answers as scripted: a 400 first
    try:
        fake.script.append((400, {}))
        dest = add_destination(db, fake.url)
        cycle(db, [finding()], 0)
        assert push(db)["failed"] == 1
        with db.connect() as conn:
            (st,) = notify_status(conn=conn)["alertmanagers"]
        assert st["state"] == "failing" and st["last_status_code"] == 400 and st["last_error"] == "HTTP 400: ok"
        backoff_over(db)
        assert push(db)["delivered"] == 1
        (req,) = fake.bodies("/api/v2/alerts")[1:]
        assert req.headers["content-type"] == "application/json"
        (body,) = json.loads(req.body)
        assert body["labels"]["alertname"] == "rx_power_degrading" and body["endsAt"] > body["startsAt"]
        # Disabled: nothing is sent, the state waits; enabled again: sent.
        with db.begin() as conn:
            update_destination(conn=conn, destination_id=dest, values={"enabled": False}, settings=FAST)
        with db.begin() as conn:
            conn.execute(text("UPDATE alertmanager_outbox SET next_attempt_at = now()"))
        assert push(db) == {}
        with db.begin() as conn:
            update_destination(conn=conn, destination_id=dest, values={"enabled": True}, settings=FAST)
        assert push(db)["delivered"] == 1
    finally:
        fake.stop()


def test_api_destinations_and_notify_status(db: Engine, db_url: str, am: Alertmanager,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from tests.alerts.test_api import make_app

    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    cycle(db, [finding(device="leaf-01"), finding(device="leaf-02", severity=Severity.TICKET)], 0)
    with TestClient(make_app(db_url, auth_required=False)) as client:
        r = client.post("/api/v1/alertmanagers", json={"name": "am-1", "url": am.url + "/",
                                                       "filters": {"severity": ["page"]}})
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["url"] == am.url and made["filters"]["severity"] == ["page"] and made["enabled"]
        assert client.post("/api/v1/alertmanagers", json={"name": "am-1", "url": am.url}).status_code == 409
        refused = client.post("/api/v1/alertmanagers", json={"name": "meta", "url": "http://169.254.169.254:9093"})
        assert refused.status_code == 422 and "metadata" in refused.json()["detail"]
        assert client.post("/api/v1/alertmanagers", json={"name": "x", "url": am.url, "nope": 1}).status_code == 422
        assert client.get("/api/v1/alertmanagers/999").status_code == 404
        assert client.post("/api/v1/webhooks", json={"name": "noc", "url": am.url + "/hook"}).status_code == 201

        st = client.get("/api/v1/notify").json()
        (a,) = st["alertmanagers"]
        assert a["state"] == "idle" and a["firing"] == 1 and a["pending"] == 1   # seeded: the page, not the ticket
        assert st["webhooks"][0]["name"] == "noc" and st["webhooks"][0]["pending"] == 0

        push(db)
        (a,) = client.get("/api/v1/notify").json()["alertmanagers"]
        assert a["state"] == "ok" and a["pending"] == 0 and a["last_status_code"] == 200
        assert set(ours(am.wait_alerts(lambda x: len(x) == 1))) == {"leaf-01"}

        # Widening the filters seeds the ticket too.
        assert client.patch(f"/api/v1/alertmanagers/{made['id']}", json={"filters": {}}).status_code == 200
        push(db)
        assert set(ours(am.wait_alerts(lambda x: len(x) == 2))) == {"leaf-01", "leaf-02"}
        assert client.patch(f"/api/v1/alertmanagers/{made['id']}",
                            json={"url": "http://169.254.169.254"}).status_code == 422
        # null is "leave it as it is" (found by fuzzing: a null url was a 500, a null name a 409)
        kept = client.patch(f"/api/v1/alertmanagers/{made['id']}",
                            json={"name": None, "url": None, "filters": None, "enabled": None})
        assert kept.status_code == 200 and kept.json()["url"] == am.url and kept.json()["name"] == "am-1"
        assert client.patch(f"/api/v1/alertmanagers/{made['id']}", json={"enabled": False}).json()["enabled"] is False
        assert client.get("/api/v1/notify").json()["alertmanagers"][0]["state"] == "disabled"
        assert client.delete(f"/api/v1/alertmanagers/{made['id']}").status_code == 204
        assert client.get("/api/v1/notify").json()["alertmanagers"] == []
        assert client.delete(f"/api/v1/alertmanagers/{made['id']}").status_code == 404


@pytest.mark.parametrize(("env", "words"), [
    ({"FABRICWATCH_ALERTMANAGER_RESEND_S": "300"}, "ends_after_s (240) must be longer than resend_s (300)"),
    ({"FABRICWATCH_ALERTMANAGER_RUNBOOK_URL": "https://wiki/{cuase}"}, "unknown placeholder(s) cuase"),
    ({"FABRICWATCH_ALERTMANAGER_RUNBOOK_URL": "https://wiki/{cause"}, "runbook_url: "),
    ({"FABRICWATCH_ALERTMANAGER_EXTERNAL_LABELS": '{"severity": "x"}'}, "'severity' is one of fabricwatch's own"),
    ({"FABRICWATCH_ALERTMANAGER_EXTERNAL_LABELS": '{"a-b": "x"}'}, "'a-b' is not a label name"),
    ({"FABRICWATCH_ALERTMANAGER_EXTERNAL_LABELS": '{"x": ""}'}, "'x' has an empty value"),
    ({"FABRICWATCH_ALERTMANAGER_EXTERNAL_LABELS": "cluster=a"}, "not a JSON object"),
    ({"FABRICWATCH_ALERTMANAGER_BATCH_SIZE": "0"}, "FABRICWATCH_ALERTMANAGER_BATCH_SIZE"),
])
def test_bad_settings_stop_start_up_naming_them(env: dict[str, str], words: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from service.config import SettingsError, load_settings

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError, match="FABRICWATCH_ALERTMANAGER") as err:
        load_settings()
    assert words in str(err.value)


def test_recording_a_delivery_never_deadlocks_with_a_cycle_that_changes_its_alerts(db: Engine) -> None:
    """While a POST is in flight, a transaction (here two acknowledgements, as a detection cycle changes
    several alerts) takes the second row of the batch, then the first. Recording the delivery row by row,
    each in its own transaction, waits for it instead of holding the first row: before, it held the first
    while it waited for the second, and PostgreSQL killed one of the two as a deadlock after a second."""
    import threading

    slow = Receiver().start()
    slow.delay_s = 1.0
    try:
        add_destination(db, slow.url)
        ids = cycle(db, [finding(device="leaf-01"), finding(device="leaf-02")], 0).opened
        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(push(db)))
        t.start()
        slow.wait_for(1, path="/api/v2/alerts")   # the POST is in flight: both rows are leased
        with db.begin() as conn:
            alerts.acknowledge(conn=conn, alert_id=ids[1], actor="bob")   # the second row of the batch
            time.sleep(1.5)   # the answer came; the delivery records its rows meanwhile
            alerts.acknowledge(conn=conn, alert_id=ids[0], actor="bob")   # then the first
        t.join(20)
        assert "error" not in result and result["delivered"] >= 2, result
        push(db)   # the acknowledgements went out in the same round, or go now
        with db.connect() as conn:
            rows = list(conn.execute(text("SELECT version, sent_version FROM alertmanager_outbox")))
        assert len(rows) == 2 and all(r.sent_version == r.version for r in rows)
    finally:
        slow.stop()


AM_USER, AM_PASSWORD = "fabricwatch", "am-test-password-4711"
AM_HASH = "$2b$04$dk8n4JprkNRA2RQI5SXSCOmj1VyNbNxFpLzz72nT1rXu0gu8JCE76"   # bcrypt of AM_PASSWORD, cost 4


def test_an_alertmanager_behind_basic_auth_gets_alerts_with_a_sealed_credential_never_shown(
        db: Engine, db_url: str, tmp_path: Path, hook: Receiver, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from fastapi.testclient import TestClient

    from tests.alerts.test_api import make_app

    require_alertmanager()
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    locked = Alertmanager(tmp_path, hook.url + "/am", basic_auth=(AM_USER, AM_PASSWORD, AM_HASH)).start()
    try:
        cycle(db, [finding()], 0)
        with TestClient(make_app(db_url, auth_required=False)) as client:
            made = client.post("/api/v1/alertmanagers", json={"name": "locked", "url": locked.url}).json()
            assert made["auth"] == "none"
            assert push(db)["failed"] == 1   # Alertmanager's own basic auth refuses it
            (st,) = client.get("/api/v1/notify").json()["alertmanagers"]
            assert st["state"] == "failing" and st["last_status_code"] == 401

            both = client.patch(f"/api/v1/alertmanagers/{made['id']}", json={
                "basic_auth": {"username": AM_USER, "password": AM_PASSWORD}, "bearer_token": "x"})
            assert both.status_code == 422
            r = client.patch(f"/api/v1/alertmanagers/{made['id']}",
                             json={"basic_auth": {"username": AM_USER, "password": AM_PASSWORD}})
            assert r.status_code == 200 and r.json()["auth"] == "basic" and AM_PASSWORD not in r.text
            with db.begin() as conn:   # the backoff is over
                conn.execute(text("UPDATE alertmanager_destinations SET retry_at = NULL"))
            assert push(db)["delivered"] == 1
            assert [a["labels"]["device"] for a in locked.alerts()] == ["leaf-01"]
            assert client.get("/api/v1/notify").json()["alertmanagers"][0]["state"] == "ok"
            listed = client.get("/api/v1/alertmanagers").text
            assert AM_PASSWORD not in listed and "credential" not in listed
            with db.connect() as conn:
                stored = conn.execute(text("SELECT credential FROM alertmanager_destinations")).scalar_one()
            assert stored.startswith("fernet:") and AM_PASSWORD not in stored

            cleared = client.patch(f"/api/v1/alertmanagers/{made['id']}", json={"clear_auth": True})
            assert cleared.json()["auth"] == "none"
            with db.connect() as conn:
                assert conn.execute(text("SELECT credential FROM alertmanager_destinations")).scalar() is None
    finally:
        locked.stop()
    assert AM_PASSWORD not in caplog.text


def test_a_bearer_token_is_sent_and_without_a_secrets_key_none_is_stored(
        db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from service.config import get_settings
    from tests.alerts.test_api import make_app

    proxy = Receiver().start()   # a proxy in front of an Alertmanager that wants a bearer token
    try:
        with db.begin() as conn:
            create_destination(conn=conn, name="proxied", url=proxy.url, filters={}, enabled=True, created_by="t",
                               auth=("bearer", "Bearer tok-0123456789"), settings=FAST)
        cycle(db, [finding()], 0)
        assert push(db)["delivered"] == 1
        (req,) = proxy.bodies("/api/v2/alerts")
        assert req.headers["authorization"] == "Bearer tok-0123456789"
    finally:
        proxy.stop()

    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    monkeypatch.delenv("FABRICWATCH_SECRETS_KEY")
    get_settings.cache_clear()
    with TestClient(make_app(db_url, auth_required=False)) as client:
        r = client.post("/api/v1/alertmanagers", json={"name": "x", "url": "http://127.0.0.1:9093",
                                                       "bearer_token": "tok-0123456789"})
        assert r.status_code == 503 and "FABRICWATCH_SECRETS_KEY" in r.json()["detail"]
        assert [d["name"] for d in client.get("/api/v1/alertmanagers").json()] == ["proxied"]
        # A sealed credential that cannot be opened now: nothing is sent, and the status says why.
        with db.begin() as conn:   # the re-send is due
            conn.execute(text("UPDATE alertmanager_outbox SET next_attempt_at = now()"))
        assert push(db)["failed"] == 1
        (st,) = client.get("/api/v1/notify").json()["alertmanagers"]
        assert st["state"] == "failing" and "FABRICWATCH_SECRETS_KEY" in st["last_error"]


def test_rotate_reseals_alertmanager_credentials(db: Engine) -> None:
    from cryptography.fernet import Fernet, MultiFernet

    from service.notify.sealing import Sealer, SealError, reseal_alertmanagers

    old, new = Fernet.generate_key(), Fernet.generate_key()
    with db.begin() as conn:
        conn.execute(text("INSERT INTO alertmanager_destinations (name, url, created_by, auth_kind, credential) "
                          "VALUES ('am', 'http://127.0.0.1:9093', 't', 'bearer', :a)"),
                     {"a": Sealer(MultiFernet([Fernet(old)])).seal("Bearer tok")})
    with pytest.raises(SealError, match="Alertmanager destination"), db.begin() as conn:
        reseal_alertmanagers(conn, Sealer(MultiFernet([Fernet(new)])))   # the old key is missing: nothing written
    with db.begin() as conn:
        assert reseal_alertmanagers(conn, Sealer(MultiFernet([Fernet(new), Fernet(old)]))) == 1
    with db.connect() as conn:
        stored = conn.execute(text("SELECT credential FROM alertmanager_destinations")).scalar_one()
    assert Sealer(MultiFernet([Fernet(new)])).open(stored) == "Bearer tok"
