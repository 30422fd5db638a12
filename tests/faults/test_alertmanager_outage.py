"""The Alertmanager is down for "10 minutes" and comes back empty (Alertmanager keeps its alerts in memory):
it gets back exactly what fires in fabricwatch, the resolves of what cleared meanwhile included, and the
webhooks are delivered all along.

Time is scaled by 1/60, as in test_webhook_outage.py: resend 1 s (60 s), endsAt 4 s ahead (240 s), backoff
2/60 s doubling to 1 s (2 s to 60 s), the Alertmanager really down for 10 s. Delivery runs in a real
`fabricwatch worker --beat` (deliver_alertmanager and deliver_outbox every 0.5 s) on a private Redis; the
Alertmanager is the real one (Debian's prometheus-alertmanager) on 127.0.0.1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from service.alerts import service as alerts
from service.alerts.service import apply_findings
from service.notify.destinations import create_destination
from tests.alertmanager_peer import Alertmanager, require_alertmanager
from tests.alerts import STEP, T0, finding
from tests.faults.peers import CountingWorker, PrivateRedis
from tests.notify.test_delivery import FAST, subscribe
from tests.receiver import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCALE = 60.0
DOWN_S = 10.0


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


def _outbox(db: Engine) -> list[tuple[int, str, bool]]:
    with db.connect() as conn:
        return [(r.alert_id, r.status, r.sent_version == r.version) for r in conn.execute(text(
            "SELECT alert_id, status, version, sent_version FROM alertmanager_outbox ORDER BY alert_id"))]


def test_alertmanager_down_ten_scaled_minutes_and_back_empty(
        db: Engine, db_url: str, private_redis: PrivateRedis, tmp_path: Path) -> None:
    require_alertmanager()
    pages, webhook = Receiver().start(), Receiver().start()
    (tmp_path / "am").mkdir()
    am = Alertmanager(tmp_path / "am", pages.url + "/am").start()
    subscribe(db, webhook.url + "/hook")
    with db.begin() as conn:
        create_destination(conn=conn, name="am", url=am.url, filters={}, enabled=True, created_by="t", settings=FAST)
    worker = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url, queues="fabricwatch",
                            concurrency=2, extra_env={
                                "FABRICWATCH_WEBHOOK_ALLOW": "127.0.0.1/32",
                                "FABRICWATCH_WEBHOOK_POLL_S": "0.5",
                                "FABRICWATCH_ALERTMANAGER_POLL_S": "0.5",
                                "FABRICWATCH_ALERTMANAGER_RESEND_S": str(60 / SCALE),
                                "FABRICWATCH_ALERTMANAGER_ENDS_AFTER_S": str(240 / SCALE),
                                "FABRICWATCH_ALERTMANAGER_BACKOFF_BASE_S": str(2 / SCALE),
                                "FABRICWATCH_ALERTMANAGER_BACKOFF_MAX_S": str(60 / SCALE),
                                "FABRICWATCH_ALERTMANAGER_TIMEOUT_S": "2"}).start()
    try:
        with db.begin() as conn:
            first = apply_findings(conn=conn, findings=[finding(device=f"leaf-{i:02d}") for i in range(6)],
                                   at_ms=T0).opened
        am.wait_alerts(lambda a: len(a) == 6, timeout_s=30)

        am.stop()
        down_from = time.monotonic()
        with db.begin() as conn:   # while it is down: six more open, two of the first resolve
            second = apply_findings(conn=conn, findings=[finding(device=f"leaf-{i:02d}") for i in range(12)],
                                    at_ms=T0 + STEP).opened
            for alert_id in first[:2]:
                alerts.resolve(conn=conn, alert_id=alert_id, actor="alice")
        webhook_sent = time.monotonic()
        webhook.wait_for(6 + 6 + 2, timeout_s=30, path="/hook")   # firing x 12, resolved x 2
        webhook_s = time.monotonic() - webhook_sent
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - down_from)))
        with db.connect() as conn:
            failures = conn.execute(text("SELECT failures FROM alertmanager_destinations")).scalar_one()
        am.start()   # empty: Alertmanager does not keep alerts across a restart
        back = time.monotonic()
        firing = {f"leaf-{i:02d}" for i in range(2, 12)}
        held = am.wait_alerts(lambda a: {x["labels"]["device"] for x in a} == firing, timeout_s=30)
        back_s = time.monotonic() - back
        deadline = time.monotonic() + 10
        while not all(ok for _, _, ok in _outbox(db)) and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = _outbox(db)
    finally:
        worker.stop()
        am.stop()
        pages.stop()
        webhook.stop()
    assert worker.proc is not None and "Traceback" not in worker.tail(100_000), worker.tail()
    assert len(second) == 6 and len(held) == 10
    assert [(a, s) for a, s, _ in rows if s == "resolved"] == [(first[0], "resolved"), (first[1], "resolved")]
    assert len(rows) == 12 and all(ok for _, _, ok in rows)   # every change accepted: nothing lost
    assert failures >= 3   # it was tried again and again while down
    print(f"\nAlertmanager down {DOWN_S:.0f} s (= {DOWN_S * SCALE / 60:.0f} min scaled), {failures} failed POSTs; "
          f"webhooks meanwhile: all 14 in {webhook_s:.1f} s; Alertmanager back empty: the 10 firing alerts held "
          f"again {back_s:.1f} s after it came back (resend {60 / SCALE:.0f} s, backoff cap {60 / SCALE:.0f} s)")
