"""Recovery times on a scripted incident timeline: the pure computation, and the SQL over real tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from service.kpis.service import Timeline, load_timelines, percentile, recovery_times

T = datetime(2026, 1, 1, tzinfo=UTC)


def _t(minutes: float | None) -> datetime | None:
    return None if minutes is None else T + timedelta(minutes=minutes)


SCRIPT = [  # id, cause, pod, onset, alert, drained, returned (minutes)
    (1, "connector_contamination", "p1", 0, 2, 5, 65),      # detect 120 s, mitigate 180 s, restore 3600 s
    (2, "connector_contamination", "p1", 10, 11, 21, 51),   # 60 / 600 / 1800
    (3, "flap_storm", "p2", 20, 20.5, 22, None),            # 30 / 90 / not returned
    (4, "flap_storm", "p1", 30, 34, None, None),            # 240 / not drained
]


def test_pure_recovery_times() -> None:
    rep = recovery_times([Timeline(i, c, p, _t(o), _t(a), _t(d), _t(r)) for i, c, p, o, a, d, r in SCRIPT])
    by_id = {d.incident_id: d for d in rep.incidents}
    assert (by_id[1].detect_s, by_id[1].mitigate_s, by_id[1].restore_s) == (120, 180, 3600)
    assert (by_id[2].detect_s, by_id[2].mitigate_s, by_id[2].restore_s) == (60, 600, 1800)
    assert by_id[3].restore_s is None and by_id[4].mitigate_s is None and by_id[4].mitigation_met is None
    assert [by_id[i].mitigation_met for i in (1, 2, 3)] == [True, False, True]
    assert rep.overall.incidents == 4
    assert rep.overall.mitigate.count == 3 and rep.overall.mitigate.p50 == 180
    assert rep.overall.mitigate.p90 == pytest.approx(180 + 0.8 * 420)   # sorted 90, 180, 600
    assert rep.overall.detect.max == 240
    assert rep.overall.mitigation_within_target == pytest.approx(2 / 3)
    cc = rep.by_cause["connector_contamination"]
    assert cc.restore.p50 == pytest.approx(2700) and cc.mitigation_within_target == 0.5
    assert rep.by_pod["p2"].mitigate.p95 == 90
    strict = recovery_times([Timeline(1, None, None, _t(0), _t(1), _t(3), None)], mitigation_target_s=60)
    assert strict.incidents[0].mitigation_met is False and strict.incidents[0].cause == "unknown"


def test_percentile_edges() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([1, 2, 3, 4], 0.5) == 2.5


def test_timelines_from_incident_and_alert_tables(db: Engine) -> None:
    with db.begin() as conn:
        for i, cause, pod, onset, alert, drained, returned in SCRIPT:
            ms = int(_t(alert).timestamp() * 1000)  # type: ignore[union-attr]
            conn.execute(text(
                "INSERT INTO alerts (id, fingerprint, kind, scope, device, state, severity, cause, action, "
                "first_opened_at_ms, opened_at_ms, last_seen_ms, evidence) VALUES (:i, :f, 'k', 'port', 'd', "
                "'firing', 'page', :c, 'none', :ms, :ms, :ms, CAST(:ev AS jsonb))"),
                {"i": i, "f": f"k/{i}", "c": cause, "ms": ms,
                 "ev": f'[{{"feature": "x", "value": 1, "onset_ms": {int(_t(onset).timestamp() * 1000)}}}]'})
            conn.execute(text(
                "INSERT INTO incidents (id, entity_kind, entity, device, pod, state, cause, alert_id, fault_at, "
                "opened_at, updated_at, state_since) VALUES (:i, 'port', :e, 'd', :pod, 'suspect', :c, :i, "
                ":fault, :opened, :opened, :opened)"),
                {"i": i, "e": f"port:d:{i}", "pod": pod, "c": cause, "fault": _t(alert), "opened": _t(alert)})
            for state, at in (("drained", drained), ("returned_to_service", returned)):
                if at is not None:
                    conn.execute(text("INSERT INTO incident_events (incident_id, ts, actor, kind, to_state) "
                                      "VALUES (:i, :ts, 't', 'transition', :s)"), {"i": i, "ts": _t(at), "s": state})
        tls = load_timelines(conn=conn, start=T - timedelta(days=1), end=T + timedelta(days=1))
    assert [(t.incident_id, t.onset, t.first_alert, t.drained, t.returned) for t in tls] == \
        [(i, _t(o), _t(a), _t(d), _t(r)) for i, _, _, o, a, d, r in SCRIPT]
    rep = recovery_times(tls)
    assert rep.overall.mitigate.p50 == 180 and rep.by_pod["p1"].incidents == 3
