"""Alert lifecycle: dedup, hysteresis, grouping, silences, maintenance, manual actions, one transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from service.alerts import service
from service.alerts.service import apply_findings, ms_to_dt
from service.detection.findings import Action, Cause, Evidence, Finding, Severity
from service.notify.service import create_subscription
from tests.alerts import STEP, T0, finding

LOOPBACK = __import__("service.notify", fromlist=["NotifySettings"]).NotifySettings(allow=("127.0.0.0/8",))
QUICK = Cause.MODULE_ALARM  # a cause with no hold-down of its own: these tests watch clear_cycles at work


@pytest.fixture()
def sub(db: Engine) -> int:
    """One subscription that wants everything, so outbox rows show what would be sent."""
    with db.begin() as conn:
        return create_subscription(conn=conn, name="all", url="http://127.0.0.1:9/hook", format="generic",
                                   secret=None, routing_key=None, filters={}, send_resolved=True, enabled=True,
                                   created_by="test", settings=LOOPBACK)["id"]


def cycle(db: Engine, i: int, *findings: Finding, clear: int = 3) -> service.ChangeSet:
    with db.begin() as conn:
        return apply_findings(conn=conn, findings=list(findings), at_ms=T0 + i * STEP, clear_cycles=clear)


def outbox(db: Engine) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT alert_id, event, idempotency_key, message FROM webhook_outbox ORDER BY id")).mappings()]


def history(conn: Connection, alert_id: int) -> list[str]:
    return [e["event"] for e in service.list_events(conn=conn, alert_id=alert_id)]


def test_dedup_by_fingerprint_and_severity_from_finding(db: Engine, sub: int) -> None:
    f = finding(severity=Severity.TICKET)
    cs = cycle(db, 0, f, finding(severity=Severity.TICKET, score=1.0))
    assert len(cs.opened) == 1
    cycle(db, 1, f)
    with db.connect() as conn:
        rows = conn.execute(text("SELECT id, severity, fingerprint FROM alerts")).all()
    assert len(rows) == 1 and rows[0].severity == "ticket" and rows[0].fingerprint == f.fingerprint
    assert [m["event"] for m in outbox(db)] == ["firing"]


def test_hysteresis_holding_keeps_absent_resolves_and_reopen_keeps_history(db: Engine, sub: int) -> None:
    seq = ["firing", "holding", None, "holding", None, None, None, "holding", "firing"]
    log = []
    for i, st in enumerate(seq):
        cs = cycle(db, i, *([finding(state=st, at_ms=T0 + i * STEP, cause=QUICK)] if st else []))
        log.append([c.event for c in cs.changes])
    assert log == [["opened"], [], [], [], [], [], ["resolved"], [], ["reopened"]]
    with db.connect() as conn:
        (aid,) = conn.execute(text("SELECT id FROM alerts")).scalars()
        events = service.list_events(conn=conn, alert_id=aid)
        alert = service.get_alert(conn=conn, alert_id=aid)
    assert [(e["event"], e["at_ms"], e["actor"]) for e in events] == [
        ("opened", T0, "detector"), ("resolved", T0 + 6 * STEP, "detector"), ("reopened", T0 + 8 * STEP, "detector")]
    assert alert is not None and alert["episode"] == 2 and alert["state"] == "firing"
    # the reopen 8 min after its first page does not page again (repeat interval): it is recorded, muted
    assert [m["event"] for m in outbox(db)] == ["firing", "resolved"]
    assert events[-1]["detail"]["muted_by"] == "repeat_interval" and alert["muted_by"] == "repeat_interval"


def test_a_link_hovering_at_the_threshold_does_not_flap(db: Engine, sub: int) -> None:
    for i in range(20):  # firing on even cycles, absent on odd ones (never 3 absent in a row)
        cycle(db, i, *([finding(at_ms=T0 + i * STEP)] if i % 2 == 0 else []))
    with db.connect() as conn:
        (aid,) = conn.execute(text("SELECT id FROM alerts")).scalars()
        assert history(conn, aid) == ["opened"]
    assert len(outbox(db)) == 1


def test_holding_alone_never_opens(db: Engine, sub: int) -> None:
    for i in range(3):
        assert cycle(db, i, finding(state="holding")).changes == []
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alerts")).scalar() == 0


def test_shared_component_gives_one_grouped_alert(db: Engine, sub: int) -> None:
    # A member link alert already open and notified before the device-level cause is known.
    early = finding(kind="post_fec_errors", port="Ethernet1/1")
    cycle(db, 0, early)
    links = [finding(kind="post_fec_errors", port=f"Ethernet1/{i}") for i in (1, 2, 3)]
    peer = finding(kind="rx_power_degrading", device="spine-01", port="Ethernet7/1", peer_device="leaf-01",
                   peer_port="Ethernet1/4")
    device = finding(kind="shared_component", port=None, scope="device",
                     members=["Ethernet1/1", "Ethernet1/2", "Ethernet1/3", "Ethernet1/4"])
    cs = cycle(db, 1, *links, peer, device)
    with db.connect() as conn:
        rows = {r.fingerprint: r for r in conn.execute(text("SELECT * FROM alerts"))}
    parent = rows[device.fingerprint]
    children = [r for r in rows.values() if r.id != parent.id]
    assert len(children) == 4 and all(r.parent_id == parent.id for r in children)
    assert all(r.muted_by == f"inhibited:{parent.id}" for r in children)
    # Only the device-level alert notifies in cycle 1 (the early link alert notified in cycle 0).
    sent = [(m["alert_id"], m["event"]) for m in outbox(db)]
    assert sent == [(rows[early.fingerprint].id, "firing"), (parent.id, "firing")]
    assert cs.notifications == 1
    with db.connect() as conn:
        assert service.get_alert(conn=conn, alert_id=parent.id, with_events=True)["children"] == sorted(
            r.id for r in children)


def test_silence_mutes_notifications_but_keeps_history_then_lets_go(db: Engine, sub: int) -> None:
    with db.begin() as conn:
        service.create_silence(conn=conn, matchers=[{"name": "device", "value": "leaf-0[1-2]", "is_regex": True},
                                                    {"name": "severity", "value": "page"}],
                               starts_at=ms_to_dt(T0), ends_at=ms_to_dt(T0 + 2 * STEP), created_by="alice",
                               comment="optics swap")
    f, other = finding(cause=QUICK), finding(device="leaf-03", cause=QUICK)
    cycle(db, 0, f, other)
    cycle(db, 1, f, other)
    with db.connect() as conn:
        rows = {r.device: r for r in conn.execute(text("SELECT * FROM alerts"))}
    assert rows["leaf-01"].muted_by.startswith("silence:") and rows["leaf-03"].muted_by is None
    assert [m["alert_id"] for m in outbox(db)] == [rows["leaf-03"].id]
    cycle(db, 2, f, other)  # the silence ended (data time) and the alert still fires: it notifies now
    with db.connect() as conn:
        assert history(conn, rows["leaf-01"].id) == ["opened", "unmuted"]
        opened = service.list_events(conn=conn, alert_id=rows["leaf-01"].id)[0]
    assert opened["detail"]["muted_by"].startswith("silence:")
    assert [m["alert_id"] for m in outbox(db)] == [rows["leaf-03"].id, rows["leaf-01"].id]
    # A muted alert that never notified resolves silently; one that notified sends its resolve.
    for i in range(3, 6):
        cycle(db, i)
    assert [m["event"] for m in outbox(db)] == ["firing", "firing", "resolved", "resolved"]


def test_maintenance_window_mutes_device_and_the_peer_end(db: Engine, sub: int) -> None:
    with db.begin() as conn:
        service.create_maintenance(conn=conn, device="leaf-01", port=None, starts_at=ms_to_dt(T0 - 1000),
                                   ends_at=ms_to_dt(T0) + timedelta(hours=1), created_by="bob", comment="RMA")
    local = finding()
    peer = finding(device="spine-01", port="Ethernet7/1", peer_device="leaf-01", peer_port="Ethernet1/1")
    unrelated = finding(device="leaf-02")
    cycle(db, 0, local, peer, unrelated)
    with db.connect() as conn:
        rows = {r.device: r for r in conn.execute(text("SELECT * FROM alerts"))}
    assert len(rows) == 3
    assert rows["leaf-01"].muted_by.startswith("maintenance:") and rows["spine-01"].muted_by.startswith("maint")
    assert [m["alert_id"] for m in outbox(db)] == [rows["leaf-02"].id]


def test_ack_resolve_comment_are_attributed_and_notified(db: Engine, sub: int) -> None:
    cycle(db, 0, finding())
    with db.begin() as conn:
        (aid,) = conn.execute(text("SELECT id FROM alerts")).scalars()
        service.acknowledge(conn=conn, alert_id=aid, actor="alice", comment="on it", at_ms=T0 + 10)
        service.acknowledge(conn=conn, alert_id=aid, actor="alice")  # idempotent: no second event
        service.add_comment(conn=conn, alert_id=aid, actor="bob", comment="reseated", at_ms=T0 + 20)
        service.resolve(conn=conn, alert_id=aid, actor="bob", at_ms=T0 + 30)
        with pytest.raises(service.AlertStateError):
            service.acknowledge(conn=conn, alert_id=aid, actor="carol")
        events = service.list_events(conn=conn, alert_id=aid)
    assert [(e["event"], e["actor"], e["at_ms"]) for e in events] == [
        ("opened", "detector", T0), ("acknowledged", "alice", T0 + 10), ("commented", "bob", T0 + 20),
        ("resolved", "bob", T0 + 30)]
    assert events[1]["comment"] == "on it"
    assert [m["event"] for m in outbox(db)] == ["firing", "acknowledged", "resolved"]
    keys = [m["idempotency_key"] for m in outbox(db)]
    assert len(set(keys)) == 3
    # Still firing after a manual resolve: it re-opens (the fix did not take).
    cs = cycle(db, 1, finding())
    assert cs.reopened == [aid]


def test_escalation_renotifies(db: Engine, sub: int) -> None:
    cycle(db, 0, finding(severity=Severity.TICKET))
    cycle(db, 1, finding(severity=Severity.PAGE))
    cycle(db, 2, finding(severity=Severity.TICKET))
    msgs = outbox(db)
    assert [(m["event"], m["message"]["change"], m["message"]["alert"]["severity"]) for m in msgs] == [
        ("firing", "opened", "ticket"), ("firing", "severity_changed", "page")]


def test_severity_flapping_back_to_page_does_not_page_again_within_the_repeat_interval(db: Engine, sub: int) -> None:
    """A fault whose errors come and go (a post-FEC alert carrying a wobbling fiber) moves ticket -> page every few
    minutes: each move is recorded, but a page goes out once per repeat interval (held-out seed 7 of the detection
    evaluation's 300x900 cell: 40 escalations to page in 12 h)."""
    sev = [Severity.TICKET, Severity.PAGE] * 5
    for i, s in enumerate(sev):
        cycle(db, i, finding(severity=s, at_ms=T0 + i * STEP))
    later = 4 * 60 + 5  # 4 h 5 min after the first page: the repeat interval is over
    for i, s in ((later, Severity.TICKET), (later + 1, Severity.PAGE)):
        cycle(db, i, finding(severity=s, at_ms=T0 + i * STEP))
    with db.connect() as conn:
        aid = conn.execute(text("SELECT id FROM alerts")).scalar_one()
        assert history(conn, aid).count("severity_changed") == 11
    assert [(m["message"]["change"], m["message"]["alert"]["severity"]) for m in outbox(db)] == [
        ("opened", "ticket"), ("severity_changed", "page"), ("severity_changed", "page")]


def test_alert_change_and_outbox_commit_or_roll_back_together(db: Engine, sub: int) -> None:
    with pytest.raises(RuntimeError), db.begin() as conn:
        apply_findings(conn=conn, findings=[finding()], at_ms=T0)
        assert conn.execute(text("SELECT count(*) FROM webhook_outbox")).scalar() == 1
        raise RuntimeError("crash after the alert change, before commit")
    with db.connect() as conn:
        assert conn.execute(text("SELECT (SELECT count(*) FROM alerts) + (SELECT count(*) FROM alert_events)"
                                 " + (SELECT count(*) FROM webhook_outbox)")).scalar() == 0


def test_listener_sees_changes_in_the_same_transaction(db: Engine) -> None:
    seen: list[tuple[str, int]] = []

    def listener(conn: Connection, change: service.AlertChange) -> None:
        seen.append((change.event, conn.execute(text("SELECT count(*) FROM alerts")).scalar_one()))

    service.on_alert_change(listener)
    try:
        cycle(db, 0, finding())
    finally:
        service._listeners.remove(listener)
    assert seen == [("opened", 1)]


def _storm(i: int, flaps: int, state: str = "firing") -> Finding:
    return finding(kind="flap_storm", state=state, at_ms=T0 + i * STEP, score=float(flaps), cause=Cause.FLAP_STORM,
                   summary=f"link flap storm on leaf-01:Ethernet1/1: {flaps} flaps in one poll step",
                   evidence=[Evidence("flaps_per_window", float(flaps), baseline=0.0, unit="per 75 s")])


def test_an_alert_keeps_the_peak_of_its_episode_not_the_clearing_cycle(db: Engine, sub: int) -> None:
    # The storm peaks in cycle 1; the persistence window keeps it firing (then holding) with 0 flaps.
    for i, (flaps, st) in enumerate([(6, "firing"), (9, "firing"), (0, "firing"), (0, "holding")]):
        cycle(db, i, _storm(i, flaps, st))
    with db.connect() as conn:
        (aid,) = conn.execute(text("SELECT id FROM alerts")).scalars()
        a = service.get_alert(conn=conn, alert_id=aid)
    assert a is not None and a["summary"].endswith(": 9 flaps in one poll step")
    assert (a["peak_score"], a["peak_at_ms"]) == (9.0, T0 + STEP)
    assert a["peak_evidence"][0]["value"] == 9.0
    assert a["score"] == 0.0 and a["evidence"][0]["value"] == 0.0  # the last cycle is still there to see
    for i in range(4, 7):  # cleared: resolves, and says what happened, not "0 flaps"
        cycle(db, i)
    with db.connect() as conn:
        a = service.get_alert(conn=conn, alert_id=aid)
    assert a is not None and a["state"] == "resolved" and "9 flaps" in a["summary"]
    resolved = [m for m in outbox(db) if m["event"] == "resolved"]
    assert len(resolved) == 1 and "9 flaps" in resolved[0]["message"]["alert"]["summary"]
    cycle(db, 7, _storm(7, 5))  # a new episode starts its own peak
    with db.connect() as conn:
        a = service.get_alert(conn=conn, alert_id=aid)
    assert a is not None and a["episode"] == 2 and "5 flaps" in a["summary"]
    assert (a["peak_score"], a["peak_at_ms"]) == (5.0, T0 + 7 * STEP)


def _loose(i: int, state: str = "firing") -> Finding:
    return finding(kind="loose_module", state=state, at_ms=T0 + i * STEP, cause=Cause.LOOSE_MODULE,
                   severity=Severity.TICKET, action=Action.RESEAT, summary="loose module at leaf-01:Ethernet1/1")


def test_an_intermittent_fault_is_one_alert_until_clear_for_its_hold_down(db: Engine, sub: int) -> None:
    """A loose module's finding comes and goes (bursts every 10-25 min): one alert, one page. It resolves only
    after 30 min of data time without the finding (loose_module's hold-down), not after 3 absent cycles."""
    present = {0, 1, 2, 12, 13, 30, 31, 55}  # absent for 9, 16 and 23 min (one cycle a minute)
    for i in range(0, 56):
        cycle(db, i, *([_loose(i)] if i in present else []))
    with db.connect() as conn:
        (aid,) = conn.execute(text("SELECT id FROM alerts")).scalars()
        assert history(conn, aid) == ["opened"]
    for i in range(56, 56 + 29):  # clear: 29 min is not yet the 30 min hold-down
        assert cycle(db, i).resolved == []
    cs = cycle(db, 85)
    assert cs.resolved == [aid]
    with db.connect() as conn:
        resolved = service.list_events(conn=conn, alert_id=aid)[-1]
    assert resolved["detail"] == {"auto": True, "absent_cycles": 30, "hold_down_ms": 30 * 60_000}
    assert [m["event"] for m in outbox(db)] == ["firing", "resolved"]


def test_reopens_lengthen_the_hold_down_and_do_not_page_within_the_repeat_interval(db: Engine, sub: int) -> None:
    """A fault that keeps coming back after its alert resolved: each reopen is counted (episode - 1), the
    next hold-down doubles (5, 15, 35 min extra: link-flap dampening), and none of the reopens pages."""
    def absent_until_resolved(i: int) -> int:
        while not cycle(db, i).resolved:
            i += 1
        return i

    i = 0
    waits = []
    for _ in range(4):
        cycle(db, i, finding(at_ms=T0 + i * STEP, cause=QUICK))
        last = i
        i = absent_until_resolved(i + 1)
        waits.append(i - last)
        i += 1
    # a module alarm has no hold-down of its own: clear_cycles (3 min), then 5, 15 and 35 min after 1-3 reopens
    assert waits == [3, 5, 15, 35]
    with db.connect() as conn:
        a = conn.execute(text("SELECT id, episode FROM alerts")).one()
        reopened = [e for e in service.list_events(conn=conn, alert_id=a.id) if e["event"] == "reopened"]
    assert a.episode - 1 == len(reopened) == 3
    assert all(e["detail"]["muted_by"] == "repeat_interval" for e in reopened)
    assert [m["event"] for m in outbox(db)] == ["firing", "resolved"]  # one page, its one resolve


def test_a_reopen_after_the_repeat_interval_pages_again(db: Engine, sub: int) -> None:
    cycle(db, 0, finding(cause=QUICK))
    for i in (1, 2, 3):
        cycle(db, i)
    later = 4 * 60 + 5  # 4 h 5 min after the first page
    cs = cycle(db, later, finding(at_ms=T0 + later * STEP, cause=QUICK))
    assert cs.reopened and cs.notifications == 1
    assert [m["event"] for m in outbox(db)] == ["firing", "resolved", "firing"]


def test_a_muted_reopen_pages_when_its_repeat_interval_ends_if_it_still_fires(db: Engine, sub: int) -> None:
    cycle(db, 0, finding(cause=QUICK))
    for i in (1, 2, 3):
        cycle(db, i)
    for i in range(4, 4 * 60 + 1):  # back at 4 min and firing on: muted until 4 h after the first page
        cs = cycle(db, i, finding(at_ms=T0 + i * STEP, cause=QUICK))
        assert cs.notifications == (1 if i == 4 * 60 else 0), i
    with db.connect() as conn:
        (aid,) = conn.execute(text("SELECT id FROM alerts")).scalars()
        assert history(conn, aid) == ["opened", "resolved", "reopened", "unmuted"]


def test_an_optical_alert_waits_two_optics_polls_before_it_resolves(db: Engine, sub: int) -> None:
    """A dirty connector does not heal in minutes, and optics may be read every 15 min: its alert resolves 30 min
    (data time) after its finding was last seen, not after 3 one-minute cycles."""
    cycle(db, 0, finding())  # cause connector_contamination
    resolved = [i for i in range(1, 40) if cycle(db, i).resolved]
    assert resolved == [30]
