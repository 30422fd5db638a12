"""Reads survive PostgreSQL ending the API's connections: the pool does not ping on checkout (a round trip
per request), so a connection ended by the server is found at checkout by its socket (the server's FATAL
and close), and a read whose connection dies after that is run again on a new one (service/db.py). The same holds for
the async connections that read a cached alert page's version (`AsyncReads`, SQLAlchemy's asyncio engine)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text

from service.api.app import create_app
from service.config import load_settings
from service.db import AsyncReads
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from tests.factories import add_hosts

NOW = datetime.now(UTC).replace(microsecond=0)
SERIES = {"metric": "port_rx_bytes_total", "device": "h-000", "port": "eth0",
          "start": (NOW - timedelta(minutes=30)).isoformat(), "end": NOW.isoformat()}


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    add_hosts(db, 1, ports=1)
    t0 = int((NOW - timedelta(minutes=20)).timestamp() * 1000)
    ingest_samples(engine=db, samples=[Sample("port_rx_bytes_total", 1e9 * i * i, t0 + 60_000 * i, "h-000", "eth0")
                                       for i in range(20)])
    with db.begin() as conn:
        conn.execute(text(
            "INSERT INTO alerts (fingerprint, kind, scope, device, port, state, severity, cause, action, summary, "
            "score, evidence, members, missed_cycles, notified, episode, first_opened_at_ms, opened_at_ms, "
            "last_seen_ms) SELECT 'fp-' || i, 'link_flap', 'port', 'h-000', 'eth0', 'firing', 'warning', "
            "'optics', 'replace_optic', 'alert ' || i, 1, '[]'::jsonb, '[]'::jsonb, 0, false, 1, :t, :t, :t "
            "FROM generate_series(1, 3) i"), {"t": t0})
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


def _reads(client: TestClient) -> tuple[Any, Any]:
    series = client.get("/api/v1/series", params=SERIES)
    alerts = client.get("/api/v1/alerts", params={"device": "h-000"})
    assert series.status_code == 200, series.text
    assert alerts.status_code == 200, alerts.text
    return series.json(), alerts.json()


def _terminate(admin: psycopg.Connection, db_url: str, pid: int | None = None) -> int:
    """End the database's backends (or one), other than the admin connection's; wait until they are gone."""
    name = db_url.rsplit("/", 1)[1]
    where = "datname = %s AND pid <> pg_backend_pid()" + (" AND pid = %s" if pid else "")
    args = (name, pid) if pid else (name,)
    ended = admin.execute(f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                          f"WHERE {where}", args).fetchone()[0]  # type: ignore[index]
    for _ in range(200):
        if not admin.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {where}", args).fetchone()[0]:  # type: ignore[index]
            return ended
        time.sleep(0.01)
    raise AssertionError("backends still there")


def _async_backends(admin: psycopg.Connection, db_url: str) -> list[int]:
    """The backends of the API's async reads (`AsyncReads`, named by application_name)."""
    rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
                         (db_url.rsplit("/", 1)[1], AsyncReads.APP_NAME)).fetchall()
    return [r[0] for r in rows]


@pytest.fixture()
def admin(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


def test_reads_after_every_backend_was_terminated(client: TestClient, admin: psycopg.Connection,
                                                  db_url: str) -> None:
    before = _reads(client)
    assert len(before[0]["series"][0]["points"]) == 19 and len(before[1]["items"]) == 3
    for _ in range(3):  # as after a restart: every pooled connection is dead
        assert _terminate(admin, db_url) >= 1
        assert _reads(client) == before


def test_a_read_whose_connection_dies_after_checkout_runs_again(client: TestClient, admin: psycopg.Connection,
                                                                db_url: str) -> None:
    before = _reads(client)
    engine = client.app.state.engine  # type: ignore[attr-defined]
    checkouts: list[int] = []
    killed: list[int] = []

    def kill_once(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # Each request's first checkout, after the pool's own check: the connection looked alive and is dead
        # by its first statement. The request's second checkout (its retry) is left alone.
        checkouts.append(dbapi_connection.info.backend_pid)
        if len(checkouts) % 2:
            killed.append(checkouts[-1])
            _terminate(admin, db_url, killed[-1])

    event.listen(engine, "checkout", kill_once)
    try:
        assert client.get("/api/v1/series", params=SERIES).json() == before[0]
        # The alert page is cached since `_reads`: its version is read on the async connections, not the pool's.
        assert client.get("/api/v1/alerts", params={"device": "h-000"}).json() == before[1]
        assert len(killed) == 1 and len(checkouts) == 2  # the series read ran again on a connection of its own
        assert not set(killed) & set(checkouts[1::2])
        # The async connections die the same way: idle and alive, then ended before the request's statement.
        reads = client.app.state.async_reads  # type: ignore[attr-defined]
        idle = _async_backends(admin, db_url)
        assert len(idle) == reads.size  # all opened at start-up (app._warm_pools)
        for pid in idle:
            _terminate(admin, db_url, pid)
        assert client.get("/api/v1/alerts", params={"device": "h-000"}).json() == before[1]
        again = _async_backends(admin, db_url)
        assert again and not set(again) & set(idle)  # replaced at checkout (its socket said so)
        # Ended after the checkout's check, as above for the pool's: the read runs once more, on a new one.
        async_killed: list[int] = []

        def kill_async_once(dbapi_connection: Any, record: Any, proxy: Any) -> None:
            if not async_killed:
                async_killed.append(dbapi_connection.driver_connection.info.backend_pid)
                _terminate(admin, db_url, async_killed[-1])

        event.listen(reads.engine.sync_engine, "checkout", kill_async_once)
        try:
            assert client.get("/api/v1/alerts", params={"device": "h-000"}).json() == before[1]
        finally:
            event.remove(reads.engine.sync_engine, "checkout", kill_async_once)
        assert async_killed
    finally:
        event.remove(engine, "checkout", kill_once)
    # Both ran again on another async connection, on the event loop: not through the sync path's pool.
    assert len(checkouts) == 2
    assert async_killed[0] not in _async_backends(admin, db_url)
