"""No finding is lost between detection and alerting (issue #17, item 1).

A cycle's detector state, findings, alerts and drain recommendations commit together, so a failure
anywhere in the cycle leaves nothing half-done, and the next cycle re-reads the same samples. One bad
drain recommendation is rolled back to its savepoint and noted on its alert; the alerts stay. A drain
command template that could only fail at run time is refused at start-up.
Real PostgreSQL throughout; the kill test SIGKILLs a real process in the middle of a cycle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import Engine, text

from service.alerts.service import _LOCK_KEY as ALERT_LOCK
from service.config import SettingsError, load_settings
from service.detection.service import backtest
from service.pipeline import run_cycle
from tests.detection.test_live import SPEC, T0, load_history

BAD_SLURM = '["scontrol", "update", "NodeName={hostname}", "State=DRAIN"]'   # {hostname} is no placeholder
MINUTE = 60_000


def _times(first_min: int, last_min: int) -> list[int]:
    return list(range(int(T0 * 1000) + first_min * MINUTE, int(T0 * 1000) + last_min * MINUTE + 1, MINUTE))


def _lost(db: Engine) -> list[tuple[str, int]]:
    """Firing findings (fingerprint, at) with no alert opened for them by then."""
    with db.connect() as conn:
        return [(r.fingerprint, r.at_ms) for r in conn.execute(text(
            "SELECT f.fingerprint, (extract(epoch FROM f.at) * 1000)::bigint AS at_ms FROM detection_findings f "
            "WHERE f.state = 'firing' AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.fingerprint = f.fingerprint "
            "AND a.first_opened_at_ms <= (extract(epoch FROM f.at) * 1000)::bigint) ORDER BY 2, 1"))]


def _firing(db: Engine) -> int:
    with db.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM detection_findings WHERE state = 'firing'")).scalar_one()


def test_a_failing_drain_recommendation_loses_no_alert(db: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL refuses every drain recommendation for one host (a trigger raises: a real error that
    aborts the transaction, as a lock or statement time-out, or a bug, would). Before: the cycle's alerts
    rolled back with it, every cycle that paged raised, and no alert at all was kept (the issue's bad
    template: 35 of 66 cycles raised, 60 firing findings, 0 alerts). Now: every firing finding has its
    alert, the other host's drain is recommended, the error is on the alert's timeline and in the log."""
    load_history(db, SPEC, 75)
    with db.begin() as conn:
        conn.execute(text("""CREATE FUNCTION fw_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'drains of % are refused here', NEW.device; END $$"""))
        conn.execute(text("CREATE TRIGGER fw_test_refuse BEFORE INSERT OR UPDATE ON drain_recommendations "
                          "FOR EACH ROW WHEN (NEW.device = 'host-p1-00002') EXECUTE FUNCTION fw_test_refuse()"))
    raised = 0
    try:
        for t in _times(10, 75):
            try:
                run_cycle(db, t)
            except Exception:
                raised += 1
    finally:
        with db.begin() as conn:
            conn.execute(text("DROP TRIGGER fw_test_refuse ON drain_recommendations; DROP FUNCTION fw_test_refuse()"))
    firing, lost = _firing(db), _lost(db)
    with db.connect() as conn:
        alerts = conn.execute(text("SELECT count(*) FROM alerts")).scalar_one()
        notes = conn.execute(text(
            "SELECT a.fingerprint, e.comment FROM alert_events e JOIN alerts a ON a.id = e.alert_id "
            "WHERE e.actor = 'fabricwatch-drains'")).all()
        drains = conn.execute(text("SELECT device FROM drain_recommendations")).scalars().all()
    print(f"\nfailing recommendation: {len(_times(10, 75))} cycles, {raised} raised; {firing} firing findings, "
          f"{alerts} alerts, {len(lost)} findings without their alert; drains {drains}; {len(notes)} notes")
    assert raised == 0
    assert firing > 0 and alerts == 2 and lost == []
    assert drains == ["host-p1-00001"]   # the other recommendation went through beside the failing one
    # noted once (not once per cycle) on the alert whose recommendation failed, with PostgreSQL's reason
    assert [fp.split("/")[1] for fp, _ in notes] == ["host-p1-00002:eth2"], notes
    assert "drain recommendation failed" in notes[0][1] and "drains of host-p1-00002 are refused" in notes[0][1]
    assert any("drain recommendation failed for post_fec_errors/host-p1-00002:eth2" in r.getMessage()
               for r in caplog.records)


def test_a_bad_drain_template_is_refused_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every drain command template is rendered with sample values when settings load: a bad one stops
    start-up in one line naming the setting and the placeholder. (Before, this template passed start-up and
    made every drain recommendation raise: in the issue's run, 35 of 66 cycles, 0 alerts kept.)"""
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SLURM_DRAIN", BAD_SLURM)
    with pytest.raises(SettingsError) as err:
        load_settings()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("setting FABRICWATCH_DRAIN_COMMAND_SLURM_DRAIN: ")
    assert "unknown placeholder {hostname}" in msg and "known: cause, host, incident, node" in msg
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SLURM_DRAIN", '["scontrol", "update", "NodeName={host}"]')
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_K8S_CORDON", '["kubectl", "cordon", "{device}"]')
    with pytest.raises(SettingsError, match=r"^setting FABRICWATCH_DRAIN_COMMAND_K8S_CORDON: unknown placeholder "
                                            r"\{device\} \(known: host, node\)$"):
        load_settings()
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_K8S_CORDON", '["kubectl", "cordon", "{node}"]')
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SHUT_PORT", '["port-shut", "{device}", "{port}", "{pod}"]')
    with pytest.raises(SettingsError, match=r"^setting FABRICWATCH_DRAIN_COMMAND_SHUT_PORT: unknown placeholder "
                                            r"\{pod\} \(known: device, port\)$"):
        load_settings()
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SHUT_PORT", '["port-shut", "--device={device}", "{port}"]')
    load_settings()   # all good again
    monkeypatch.setenv("FABRICWATCH_DRAIN_EXECUTOR", "webhook")
    with pytest.raises(SettingsError, match=r"^setting FABRICWATCH_DRAIN_WEBHOOK_URL: "):
        load_settings()


def _waiting_on_advisory_lock(db: Engine, pid: int) -> bool:
    with db.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
            "WHERE a.application_name = :app AND l.locktype = 'advisory' AND NOT l.granted"),
            {"app": f"fw-cycle-{pid}"}).scalar_one())


def test_a_cycle_killed_between_detection_and_alerts_loses_no_finding(db: Engine, db_url: str) -> None:
    """A real process runs a cycle and is SIGKILLed after detection, while it waits for the alert lock
    (held here, as a long acknowledgement would). Before: detection had committed its findings and moved
    its watermark, and the alerts never came (the finding's alert opened a cycle late, or never for a
    one-cycle finding). Now nothing of the killed cycle is kept; the next cycle re-reads its samples,
    and every firing finding stored has its alert from the cycle that stored it."""
    load_history(db, SPEC, 75)
    times = _times(10, 75)
    first = min(f.at_ms for f in backtest(db, times[0], times[-1], MINUTE) if f.state == "firing")
    before = [t for t in times if t < first]
    for t in before:
        run_cycle(db, t)
    with db.connect() as conn:
        state_before = conn.execute(text("SELECT watermark_ms, last_cycle_ms FROM detector_state")).one()
    holder = db.connect()
    holder.begin()
    holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ALERT_LOCK})
    code = ("import os, sys; from sqlalchemy import make_url; from service.db import get_engine; "
            "from service.pipeline import run_cycle; "
            "url = make_url(sys.argv[1]).update_query_dict({'application_name': f'fw-cycle-{os.getpid()}'}); "
            "run_cycle(get_engine(url.render_as_string(hide_password=False)), int(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, db_url, str(first)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _waiting_on_advisory_lock(db, proc.pid):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the cycle never reached the alert lock"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        holder.rollback()
        holder.close()
    lost_after_kill = _lost(db)
    with db.connect() as conn:
        state_after = conn.execute(text("SELECT watermark_ms, last_cycle_ms FROM detector_state")).one()
    for t in [t for t in times if t > state_after.last_cycle_ms][:3]:
        run_cycle(db, t)
    lost = _lost(db)
    print(f"\nkilled mid-cycle at {first}: {len(lost_after_kill)} findings without an alert right after the kill,"
          f" {len(lost)} after the next cycles; {_firing(db)} firing findings stored")
    assert lost_after_kill == [] and tuple(state_after) == tuple(state_before)   # the killed cycle kept nothing
    assert _firing(db) > 0 and lost == []
