"""FABRICWATCH_API_DB_THREADS: an API process runs at most that many sync route calls at once, and its
connection pool keeps as many connections, so bursts of reads reuse connections instead of opening a new
PostgreSQL backend for each request over the pool's size and closing it again (service/api/app.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from service.api import app as app_module
from service.api.app import create_app
from service.config import load_settings


class Watch:
    """Connections an engine opened, and how many of its checkouts were out at once (each held 50 ms)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.opened, self.out, self.most_out = engine, 0, 0, 0
        self.lock = threading.Lock()
        event.listen(engine, "connect", self._connect)
        event.listen(engine, "checkout", self._checkout)
        event.listen(engine, "checkin", self._checkin)

    def _connect(self, *_: Any) -> None:
        with self.lock:
            self.opened += 1

    def _checkout(self, *_: Any) -> None:
        with self.lock:
            self.out += 1
            self.most_out = max(self.most_out, self.out)
        time.sleep(0.05)  # hold the connection, so that a burst's requests overlap

    def _checkin(self, *_: Any) -> None:
        with self.lock:
            self.out -= 1

    def remove(self) -> None:
        event.remove(self.engine, "connect", self._connect)
        event.remove(self.engine, "checkout", self._checkout)
        event.remove(self.engine, "checkin", self._checkin)


@pytest.fixture()
def own_url(db: Engine, db_url: str) -> Iterator[str]:
    """The test database under a URL no other test used: an engine (and pool) of this test's own."""
    url = f"{db_url}?application_name=fw_api_threads_{time.monotonic_ns()}"
    yield url
    from service.db import get_engine

    get_engine(url).dispose()


def _burst(client: TestClient, n: int) -> None:
    with ThreadPoolExecutor(n) as pool:
        statuses = list(pool.map(lambda _: client.get("/api/v1/alerts", params={"limit": 5}).status_code, range(n)))
    assert statuses == [200] * n


def test_bursts_reuse_the_pools_connections(own_url: str) -> None:
    app = create_app(load_settings(database_url=own_url, auth_required=False))
    watch = Watch(app.state.engine)
    try:
        with TestClient(app) as client:
            # Every connection the pool keeps is opened at start-up, before the first request (app._warm_pools).
            first = watch.opened
            assert first == app.state.settings.api_db_threads
            _burst(client, 12)
            _burst(client, 12)
            _burst(client, 12)
            # Before: a pool of 5 closed the 7 overflow connections of each burst as they came back, and the
            # next burst opened 7 new ones.
            assert watch.opened == first, f"{watch.opened - first} connections opened by the bursts"
    finally:
        watch.remove()


def test_sync_route_calls_at_once_are_bounded_by_the_setting(own_url: str) -> None:
    app = create_app(load_settings(database_url=own_url, auth_required=False, api_db_threads=3))
    watch = Watch(app.state.engine)
    try:
        with TestClient(app) as client:
            _burst(client, 10)
        assert watch.most_out == 3  # anyio's default is 40 threads: all 10 would have been out at once
        assert watch.opened <= 3
    finally:
        watch.remove()


def test_the_api_starts_while_the_database_does_not_answer(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens on port 1 of loopback: each connection is refused at once.
    app = create_app(load_settings(database_url="postgresql+psycopg://postgres@127.0.0.1:1/fabricwatch",
                                   auth_required=False))
    with caplog.at_level("WARNING", logger="service.api.app"), TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/api/v1/alerts")
    assert r.status_code == 503, r.text
    assert "did not answer at start-up" in caplog.text


def test_the_api_starts_while_the_database_accepts_and_never_answers(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(app_module, "WARM_TIMEOUT_S", 0.5)
    with socket.socket() as silent:  # connections queue in its backlog: nothing ever reads or answers them
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        app = create_app(load_settings(database_url=f"postgresql+psycopg://postgres@127.0.0.1:{port}/fabricwatch",
                                       auth_required=False))
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="service.api.app"), TestClient(app) as client:
            assert time.monotonic() - started < 5
            assert client.get("/healthz").status_code == 200
    assert "did not answer at start-up within 0.5 s" in caplog.text


def test_each_pooled_connection_runs_the_pollers_reads_before_the_first_request(
        own_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A new backend's first statements on a table, and a process's first answers, queued the pollers' reads for
    the first seconds of a cold start at 500 req/s (docs/benchmarks.md): each connection runs them at start-up."""
    from service.alerts import views as alert_views
    from service.telemetry import views as telemetry_views

    seen: dict[str, list[int]] = {"alerts": [], "series": []}
    for name, module in (("alerts", alert_views), ("series", telemetry_views)):
        def spy(conn: Any, real: Any = module.warm, name: str = name) -> None:
            seen[name].append(id(conn.connection.driver_connection))
            real(conn)
        monkeypatch.setattr(module, "warm", spy)
    app = create_app(load_settings(database_url=own_url, auth_required=False, api_db_threads=4))
    with caplog.at_level("WARNING", logger="service.api.app"), TestClient(app) as client:
        assert len(set(seen["alerts"])) == len(set(seen["series"])) == 4  # before any request: one per connection
        assert client.get("/api/v1/alerts").status_code == 200
    assert "failed" not in caplog.text  # the real reads ran, on the migrated database


def test_a_read_that_fails_to_warm_is_logged_and_the_api_starts(own_url: str, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy import text

    from service.telemetry import views as telemetry_views

    def broken(conn: Any) -> None:
        conn.execute(text("SELECT * FROM no_such_table"))

    monkeypatch.setattr(telemetry_views, "warm", broken)
    app = create_app(load_settings(database_url=own_url, auth_required=False, api_db_threads=2))
    with caplog.at_level("WARNING", logger="service.api.app"), TestClient(app) as client:
        assert client.get("/api/v1/alerts").status_code == 200
    assert caplog.text.count("warming the reads of /api/v1/series failed") == 2  # one per connection
    assert "no_such_table" in caplog.text and "of /api/v1/alerts failed" not in caplog.text
