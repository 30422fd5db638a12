"""The whole cycle: detection -> alerts -> drain recommendations; and the backtest equals live."""

from __future__ import annotations

from sqlalchemy import Engine, text

from service.pipeline import replay_alerts, run_cycle
from tests.detection.test_live import SPEC, T0, load_history


def _alerts(db: Engine) -> dict[str, tuple[str, str]]:
    with db.connect() as conn:
        return {r.fingerprint: (r.state, r.severity) for r in conn.execute(text("SELECT * FROM alerts"))}


def test_live_pipeline_alerts_recommends_and_equals_the_replay(db: Engine) -> None:
    load_history(db, SPEC, 75)
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


def test_a_storm_whose_link_stays_down_is_one_page_with_its_down_time_and_drains_the_host(db: Engine) -> None:
    """A flap storm that ends with the link down: one flap_storm alert that pages once, says the link is down
    and since when for as long as it stays down (also after the storm's flaps have left the 30 min window), and
    drains the host that lost a rail path. It paged twice: the storm, then link_down once the window passed."""
    spec = {**SPEC, "faults": [{"type": "flap_storm", "device": "host-p1-00001", "port": "eth1", "at": "20m",
                                "duration": "1m", "ends": "down"}]}
    load_history(db, spec, 60)
    times = list(range(int(T0 * 1000) + 10 * 60_000, int(T0 * 1000) + 60 * 60_000 + 1, 60_000))
    live = [run_cycle(db, t) for t in times]  # the live path: detector state saved and restored each cycle
    with db.connect() as conn:
        rows = [r for r in conn.execute(text("SELECT * FROM alerts")) if r.kind != "telemetry_gap"]
        drains = conn.execute(text("SELECT alert_id, action, commands FROM drain_recommendations")).all()
        opened = conn.execute(text("SELECT count(*) FROM alert_events WHERE event IN ('opened', 'reopened')"))\
            .scalar_one()
    assert [r.kind for r in rows] == ["flap_storm"], [(r.kind, r.state) for r in rows]  # nothing optical either
    storm = rows[0]
    assert (storm.state, storm.severity, storm.cause) == ("firing", "page", "flap_storm")
    assert opened == 1
    assert {(storm.device, storm.port), (storm.peer_device, storm.peer_port)} == {
        ("host-p1-00001", "eth1"), ("leaf-p1-r1-01", "Ethernet1/1")}
    ev = {e["feature"]: e["value"] for e in storm.evidence}
    # down since the storm ended (20 m + 1 m), for 39 min at the last cycle (60 m), the flaps out of the window
    assert ev["down_for_s"] == 39 * 60
    assert "the link is down since 2025-01-01 00:21:00Z" in storm.summary  # the episode's peak, in the storm
    last = [f for f in live[-1].findings if f.fingerprint == storm.fingerprint]
    assert [f.state for f in last] == ["firing"]
    assert "link down after a flap storm" in last[0].summary and "down since 2025-01-01 00:21:00Z (39 min)" in \
        last[0].summary, last[0].summary
    assert [(d.action, d.commands[0]["argv"][2]) for d in drains if d.alert_id == storm.id] == [
        ("slurm_drain", "NodeName=host-p1-00001")]  # the host lost a rail path: drain it
    replay = replay_alerts(db, times[0], times[-1], 60_000)
    assert [(o.at_ms, c.event) for o in replay for c in o.changes.changes] == [
        (o.at_ms, c.event) for o in live for c in o.changes.changes]


def test_an_intermittent_loose_module_is_one_alert_and_one_page(db: Engine) -> None:
    """The imported fabric's loose module: bursts of uncorrectable errors with a link recovery every 10-40 min
    for 3.5 h, optical power normal, counters every 5 min, a cycle every minute. It is one loose_module alert
    (its bursts are intermittent errors, not post-FEC), held across the cycles without new counters and the
    gaps between bursts, and it pages once. It was a post-FEC alert resolved and reopened 94 times in 3.5 days,
    each time paging."""
    import numpy as np

    from service.alerts.service import apply_findings
    from service.notify.service import create_subscription
    from tests.alerts.test_lifecycle import LOOPBACK
    from tests.detection.crafted import Driver

    with db.begin() as conn:
        create_subscription(conn=conn, name="all", url="http://127.0.0.1:9/hook", format="generic", secret=None,
                            routing_key=None, filters={}, send_resolved=True, enabled=True, created_by="test",
                            settings=LOOPBACK)
    d = Driver(step_ms=300_000)
    p = d.port("h1", "eth2")
    rng = np.random.default_rng(4)
    next_burst = 6
    for k in range(int(3.5 * 12) + 6):  # 5 min polls; the bursts stop after 3.5 h
        burst = {}
        if k == next_burst and k < 42:
            rec, ber, ucw = np.zeros(d.fab.P), np.zeros(d.fab.P), np.zeros(d.fab.P)
            rec[[p, d.fab.peer[p]]] = 1  # one retrain a burst: no single burst looks like a loose module
            ber[p] = 400e9 * 300 * 1e-8 * 200  # BER up ~2.3 decades for a moment
            ucw[p] = rng.integers(120, 400)  # and a burst of uncorrectable codewords
            burst = {"port_link_error_recovery_total": rec, "port_fec_corrected_bits_total": ber,
                     "port_fec_uncorrectable_codewords_total": ucw}
            next_burst += int(rng.integers(2, 9))  # 10-40 min to the next one
        d.step(inc=burst)
        poll = d.t
        for c in range(5):  # a cycle every minute; four of five bring no new counters
            at = poll + 1000 + c * 60_000
            findings = d.eng.run_cycle(d.st, at)
            with db.begin() as conn:
                apply_findings(conn=conn, findings=findings, at_ms=at, clear_cycles=3)
    with db.connect() as conn:
        rows = conn.execute(text("SELECT id, kind, state, episode FROM alerts")).all()
        sent = conn.execute(text("SELECT event FROM webhook_outbox ORDER BY id")).scalars().all()
    assert [(r.kind, r.episode) for r in rows] == [("loose_module", 1)], rows  # one alert, never reopened
    assert sent == ["firing"]  # one page


def test_findings_carry_their_onset_and_time_to_detect_is_measured_from_it(db: Engine) -> None:
    """Every finding says when its condition first held (evidence onset_ms, data time); the KPI report's time
    to detect is the first alert minus that onset (it was unknown for every detection-opened incident)."""
    from datetime import UTC, datetime

    from service.db import session_scope
    from service.inventory.service import upsert_inventory
    from service.kpis.service import load_timelines, recovery_times
    from service.pipeline import apply_cycle
    from simulator.topology import build_topology
    from tests.api.fabric_seed import params
    from tests.detection.simfeed import Recording

    with session_scope(db) as session:
        upsert_inventory(session=session, inventory=build_topology(params()))
    # the detector's own finding: a post-FEC trickle from 20 min, polled every 5 min, a cycle every minute
    rec = Recording({"topology": params().model_dump(), "seed": 3, "faults": [
        {"type": "post_fec", "device": "host-p1-00001", "port": "eth0", "at": "20m", "post_fec_ber": 1e-10}]},
        40 * 60, step=60)
    out = rec.replay(300, 300, 60)
    first = next(f for f in out if f.kind == "post_fec_errors" and f.state == "firing")
    onset = {e.feature: e.value for e in first.evidence}["onset_ms"]
    t0 = int(T0 * 1000)
    assert t0 + 20 * 60_000 <= onset <= first.at_ms
    with db.begin() as conn:
        assert apply_cycle(conn, [first], first.at_ms).changes.opened
        tls = load_timelines(conn=conn, start=datetime.fromtimestamp(T0 - 86400, UTC),
                             end=datetime.fromtimestamp(T0 + 86400, UTC))
    assert [(t.onset.timestamp() * 1000, t.first_alert.timestamp() * 1000) for t in tls] == [(onset, first.at_ms)]
    assert recovery_times(tls).overall.detect.p50 == (first.at_ms - onset) / 1000
