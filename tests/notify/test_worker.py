"""A real Celery worker process runs `fabricwatch.deliver_outbox` and `fabricwatch.deliver_alertmanager` and
delivers to a real receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from celery import Celery
from sqlalchemy import Engine, text

from service.alerts.service import apply_findings
from service.config import load_settings
from service.notify.destinations import create_destination
from service.worker import configure
from tests.alerts import T0, finding
from tests.notify.test_delivery import subscribe
from tests.receiver import Receiver


def _delivered(db: Engine) -> int:
    with db.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM webhook_outbox WHERE status = 'delivered'")).scalar_one()


@pytest.mark.serial
def test_celery_worker_delivers_the_outbox(db: Engine, db_url: str, broker_url: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    receiver = Receiver().start()
    queue = f"fw-test-notify-{uuid.uuid4().hex[:8]}"  # private queue: no other worker on this broker takes it
    redis = broker_url if broker_url.startswith("redis") else None
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_WEBHOOK_ALLOW": "127.0.0.1/32"}
    if redis:
        env["FABRICWATCH_REDIS_URL"] = redis
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "service.worker", "worker", "-I", "service.notify.tasks",
         "-Q", queue, "-P", "solo", "-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-l", "WARNING"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        subscribe(db, receiver.url + "/hook", secret="worker-secret-0123456789")
        with db.begin() as conn:   # the receiver stands in for an Alertmanager too (POST /api/v2/alerts)
            create_destination(conn=conn, name="am", url=receiver.url, filters={}, enabled=True, created_by="t")
        with db.begin() as conn:
            cs = apply_findings(conn=conn, findings=[finding(port=f"Ethernet{i}") for i in range(3)], at_ms=T0)
        client = configure(Celery("fw-test-client"), load_settings(database_url=db_url, redis_url=redis))
        client.send_task("fabricwatch.deliver_outbox", queue=queue)
        got = receiver.wait_for(3, timeout_s=40, path="/hook")
        assert sorted(r.headers["idempotency-key"] for r in got) == sorted(
            f"fw-alert-{c.alert_id}-change-{c.event_id}" for c in cs.changes)
        # the receiver records a request before it answers, so the worker marks the last one a moment later
        deadline = time.monotonic() + 20
        while (delivered := _delivered(db)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert delivered == 3
        client.send_task("fabricwatch.deliver_alertmanager", queue=queue)
        (am,) = receiver.wait_for(1, timeout_s=40, path="/api/v2/alerts")
        assert sorted(a["labels"]["port"] for a in json.loads(am.body)) == ["Ethernet0", "Ethernet1", "Ethernet2"]
    finally:
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
        receiver.stop()
    assert b"Traceback" not in err, err.decode(errors="replace")[-2000:]
