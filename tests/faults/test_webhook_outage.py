"""The webhook receiver is down for "10 minutes": every notification is delivered once it is back.

Time is scaled by 1/60 so the test takes seconds: the worker's backoff settings are the defaults
divided by 60 (base 5 s -> 0.083 s, cap 3600 s -> 60 s) and the receiver is really down for 10 s
of wall time, measured. With the default settings that is the same attempt schedule (attempts at
~0.08, 0.25, 0.6, 1.3, 2.6, 5.3, 10.6 scaled seconds = 5 s ... 10.6 min) as 10 minutes of outage.
Delivery runs in a real `fabricwatch worker --beat` (deliver_outbox every 0.5 s) on a private Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from service.alerts.service import apply_findings
from tests.alerts import T0, finding
from tests.faults.peers import CountingWorker, PrivateRedis
from tests.notify.test_delivery import subscribe
from tests.receiver import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(180)]

SCALE = 60.0
DOWN_S = 10.0  # = 10 minutes at the default settings


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


def test_receiver_down_ten_scaled_minutes_everything_delivered(
        db: Engine, db_url: str, private_redis: PrivateRedis, tmp_path: Path) -> None:
    receiver = Receiver().start()
    port = receiver.port
    receiver.stop()  # down before the first notification exists
    subscribe(db, receiver.url + "/hook", secret="outage-secret-0123456789")
    worker = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url, queues="fabricwatch",
                            concurrency=2, extra_env={
                                "FABRICWATCH_WEBHOOK_ALLOW": "127.0.0.1/32",
                                "FABRICWATCH_WEBHOOK_BACKOFF_BASE_S": str(5.0 / SCALE),
                                "FABRICWATCH_WEBHOOK_BACKOFF_MAX_S": str(3600.0 / SCALE),
                                "FABRICWATCH_WEBHOOK_MAX_ATTEMPTS": "20",
                                "FABRICWATCH_WEBHOOK_TIMEOUT_S": "2",
                                "FABRICWATCH_WEBHOOK_POLL_S": "0.5"}).start()
    try:
        with db.begin() as conn:
            cs = apply_findings(conn=conn, findings=[finding(port=f"Ethernet{i}") for i in range(12)], at_ms=T0)
        expected = {f"fw-alert-{c.alert_id}-change-{c.event_id}" for c in cs.changes}
        down_from = time.monotonic()
        time.sleep(DOWN_S)
        with db.connect() as conn:
            failed = conn.execute(text("SELECT count(*) FROM webhook_deliveries WHERE outcome = 'retry'")).scalar()
            pending = conn.execute(text("SELECT count(*) FROM webhook_outbox WHERE status = 'pending'")).scalar()
        receiver.port = port  # back on the same address
        receiver.start()
        down_s = time.monotonic() - down_from
        got = receiver.wait_for(len(expected), timeout_s=60)
        back_after_s = time.monotonic() - down_from - down_s
        deadline = time.monotonic() + 10
        while True:
            with db.connect() as conn:
                rows = conn.execute(text("SELECT status, attempts FROM webhook_outbox")).all()
            if all(r.status == "delivered" for r in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        worker.stop()
        receiver.stop()
    assert worker.proc is not None and "Traceback" not in worker.tail(100_000), worker.tail()
    keys = [r.headers["idempotency-key"] for r in got]
    assert set(keys) == expected  # every notification, none unknown
    assert len(rows) == len(expected) and all(r.status == "delivered" for r in rows)
    assert pending == len(expected) and failed >= len(expected)
    print(f"\nreceiver down {down_s:.1f} s (= {down_s * SCALE / 60:.0f} min at default backoff); "
          f"{failed} failed attempts while down; all {len(expected)} delivered {back_after_s:.1f} s after it came "
          f"back ({len(keys)} requests received, max attempts {max(r.attempts for r in rows)})")
