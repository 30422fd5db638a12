"""The whole cycle: detection -> alerts -> drain recommendations; and the backtest equals live."""

from __future__ import annotations

from sqlalchemy import Engine, text

from service.pipeline import replay_alerts, run_cycle
from tests.detection.test_live import SPEC, T0, _load


def _alerts(db: Engine) -> dict[str, tuple[str, str]]:
    with db.connect() as conn:
        return {r.fingerprint: (r.state, r.severity) for r in conn.execute(text("SELECT * FROM alerts"))}


def test_live_pipeline_alerts_recommends_and_equals_the_replay(db: Engine) -> None:
    _load(db, SPEC, 75)
    times = list(range(int(T0 * 1000) + 10 * 60_000, int(T0 * 1000) + 75 * 60_000 + 1, 60_000))
    live = [run_cycle(db, t) for t in times]

    alerts = _alerts(db)
    assert any(fp.startswith("post_fec_errors/host-p1-00002:eth2") for fp in alerts), alerts
    assert any("host-p1-00001:eth1" in fp and "optical" in fp for fp in alerts), alerts
    paged = [fp for fp, (_, sev) in alerts.items() if sev == "page"]
    drains = [d for o in live for d in o.drains]
    with db.connect() as conn:
        rows = conn.execute(text("SELECT target, status, verdict FROM drain_recommendations")).all()
        incidents = conn.execute(text("SELECT count(*) FROM incidents")).scalar_one()
        events_before = conn.execute(text("SELECT count(*) FROM alert_events")).scalar_one()
    assert paged and drains and rows, (paged, drains, rows)  # post-FEC errors page and get a drain
    assert all("safe" in r.verdict for r in rows) and incidents >= len(rows)

    replay = replay_alerts(db, times[0], times[-1], 60_000)
    def changes(outcomes: list) -> list[tuple[int, str, str]]:
        return [(o.at_ms, c.event, c.to_state) for o in outcomes for c in o.changes.changes]
    assert changes(replay) == changes(live) and changes(live)
    # the replay changed nothing real and notified nobody
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alert_events")).scalar_one() == events_before
        assert conn.execute(text("SELECT count(*) FROM webhook_outbox")).scalar_one() == 0
    assert _alerts(db) == alerts


def test_a_finding_with_uncomputable_evidence_still_alerts(db: Engine) -> None:
    """An evidence value that could not be computed (NaN) is stored as null, not a failed cycle."""
    from service.detection.findings import Action, Cause, Evidence, Finding, Severity
    from service.pipeline import apply_cycle
    from tests.factories import add_hosts

    add_hosts(db, 1)
    f = Finding(kind="loose_module", scope="port", device="h-000", port="eth0", lane=None,
                cause=Cause.LOOSE_MODULE, severity=Severity.TICKET, action=Action.RESEAT, state="firing",
                score=2.0, at_ms=1_764_500_000_000, summary="error bursts and flaps",
                evidence=[Evidence("flap_rate", float("nan"), baseline=float("inf"), unit="1/h")])
    with db.begin() as conn:
        outcome = apply_cycle(conn, [f], f.at_ms)
    assert outcome.changes.opened
    with db.connect() as conn:
        evidence = conn.execute(text("SELECT evidence FROM alerts")).scalar_one()
    assert evidence[0]["value"] is None and evidence[0]["baseline"] is None
