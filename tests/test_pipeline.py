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
