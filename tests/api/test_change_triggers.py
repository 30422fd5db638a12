"""Database triggers announce drain, incident and target changes on commit, for the SSE stream."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg
from sqlalchemy import Engine, make_url, text

from collectors.base import CollectResult
from service.events import CHANNEL
from service.telemetry.targets import record_status
from tests.factories import add_hosts


def _listen(db_url: str) -> psycopg.Connection:
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def test_target_status_change_is_announced_on_commit_only(db: Engine, db_url: str) -> None:
    add_hosts(db, 1)
    with db.begin() as conn:
        ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                               "SELECT id, 'host', '127.0.0.1', '{}' FROM devices RETURNING id")).scalar_one()
    listener = _listen(db_url)
    try:
        with db.connect() as conn:
            record_status(conn, endpoint_id=ep, result=CollectResult("h-000/host", error="x"), stored=0,
                          at=datetime.now(UTC))
            conn.rollback()
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        with db.begin() as conn:
            record_status(conn, endpoint_id=ep, result=CollectResult("h-000/host", error="timed out"), stored=0,
                          at=datetime.now(UTC))
        got = [json.loads(n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
        assert got and got[0]["kind"] == "target"
        assert got[0]["data"] == {"endpoint_id": ep, "ok": False, "last_error": "timed out"}
    finally:
        listener.close()
