"""The cached alert page and its 304 are answered on the event loop: the version is read on an async
connection (`AsyncReads`: SQLAlchemy's asyncio engine), and only a page this process does not hold goes to
the thread pool and the engine's pool (service/alerts/views.py). Counted here by the engine's checkouts: a
request answered on the event loop takes none."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text

from service.alerts import listcache
from service.alerts.service import apply_findings
from service.api import auth
from service.auth.service import create_token
from service.db import AsyncReads
from tests.alerts import STEP, T0, finding
from tests.alerts.test_api import make_app, open_alerts


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    listcache.PAGES.clear()
    with TestClient(make_app(db_url, auth_required=False)) as c:
        yield c


@pytest.fixture()
def checkouts(client: TestClient) -> Iterator[list[int]]:
    """One entry per connection the engine's pool gives out: the sync path's, and the test's own writes (the
    `db` engine is the app's: one per URL), so a test clears it after writing."""
    engine = client.app.state.engine  # type: ignore[attr-defined]
    seen: list[int] = []

    def count(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        seen.append(1)

    event.listen(engine, "checkout", count)
    yield seen
    event.remove(engine, "checkout", count)


def _get(client: TestClient, etag: str | None = None, **params: object):  # type: ignore[no-untyped-def]
    return client.get("/api/v1/alerts", params=params, headers={"if-none-match": etag} if etag else {})


def test_a_cached_page_and_its_304_are_the_sync_paths_without_a_checkout(client: TestClient, db: Engine,
                                                                          checkouts: list[int]) -> None:
    open_alerts(db, 5)
    checkouts.clear()
    rendered = _get(client, limit=3)  # not held: rendered on the sync path
    assert rendered.status_code == 200 and len(checkouts) == 1
    cached = _get(client, limit=3)
    assert len(checkouts) == 1  # answered on the event loop
    assert cached.status_code == 200 and cached.content == rendered.content
    assert cached.headers == rendered.headers  # ETag, Cache-Control, Content-Type, Content-Length
    tag = cached.headers["etag"]
    fresh = _get(client, tag, limit=3)
    assert len(checkouts) == 1
    listcache.PAGES.clear()  # as a process that holds no page: the 304 comes from the sync path
    synced = _get(client, tag, limit=3)
    assert len(checkouts) == 2
    assert fresh.status_code == synced.status_code == 304 and fresh.content == synced.content == b""
    assert fresh.headers == synced.headers and fresh.headers["etag"] == tag


def test_a_new_cycle_makes_the_cached_page_stale(client: TestClient, db: Engine, checkouts: list[int]) -> None:
    open_alerts(db, 5)
    checkouts.clear()
    tag = _get(client, limit=3).headers["etag"]
    assert _get(client, tag, limit=3).status_code == 304 and len(checkouts) == 1
    with db.begin() as conn:  # a detection cycle: a sixth alert opens
        fs = [finding(port=f"Ethernet{i}", at_ms=T0 + STEP) for i in range(6)]
        apply_findings(conn=conn, findings=fs, at_ms=T0 + STEP, kinds=[fs[0].kind])
    checkouts.clear()
    after = _get(client, tag, limit=3)
    assert after.status_code == 200 and after.headers["etag"] != tag and len(checkouts) == 1  # rendered again
    assert after.json()["items"][0]["port"] == "Ethernet5"
    again = _get(client, after.headers["etag"], limit=3)
    assert again.status_code == 304 and len(checkouts) == 1


def test_no_version_row_means_no_etag_on_either_path(client: TestClient, db: Engine, checkouts: list[int]) -> None:
    open_alerts(db, 2)
    checkouts.clear()
    tag = _get(client).headers["etag"]
    with db.begin() as conn:
        conn.execute(text("DELETE FROM alerts_version"))
    checkouts.clear()
    r = _get(client, tag)  # the async read finds no version: the sync path renders, caching off
    assert r.status_code == 200 and "etag" not in r.headers and len(r.json()["items"]) == 2
    assert len(checkouts) == 1


def test_an_unreachable_async_connection_falls_back_to_the_sync_path(client: TestClient, db: Engine,
                                                                     checkouts: list[int],
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    open_alerts(db, 2)
    checkouts.clear()
    first = _get(client)
    tag = first.headers["etag"]
    # Nothing listens there: every async read fails, and each request says so once, then answers as before.
    client.app.state.async_reads = AsyncReads("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="service.alerts.views"):
        assert _get(client, tag).status_code == 304 and len(checkouts) == 2
        r = _get(client)
    assert r.status_code == 200 and r.content == first.content and len(checkouts) == 3
    falls = [rec for rec in caplog.records if rec.name == "service.alerts.views"]
    assert len(falls) == 2 and all(rec.levelno == logging.WARNING for rec in falls)
    assert "answering through the thread pool" in falls[0].getMessage() and "127.0.0.1" in falls[0].getMessage()


def test_auth_and_scope_still_come_first_on_a_cached_page(db: Engine, db_url: str) -> None:
    auth._failures.clear()
    listcache.PAGES.clear()
    open_alerts(db, 1)
    with db.begin() as conn:
        read = create_token(conn, name="reader", scopes=["read"])
        ingest = create_token(conn, name="pusher", scopes=["ingest"])
    with TestClient(make_app(db_url, auth_required=True)) as c:
        ok = c.get("/api/v1/alerts", headers={"authorization": f"Bearer {read}"})
        tag = ok.headers["etag"]
        assert ok.status_code == 200 and listcache.PAGES.has((None,) * 6 + ("-created", 100, None))
        for etag in (tag, None):
            inm = {"if-none-match": tag} if etag else {}
            assert c.get("/api/v1/alerts", headers={"authorization": f"Bearer {read}", **inm}).status_code == (
                304 if etag else 200)
            r = c.get("/api/v1/alerts", headers=inm)
            assert r.status_code == 401 and "etag" not in r.headers and r.headers["www-authenticate"] == "Bearer"
            r = c.get("/api/v1/alerts", headers={"authorization": "Bearer not-a-token", **inm})
            assert r.status_code == 401 and "etag" not in r.headers
            r = c.get("/api/v1/alerts", headers={"authorization": f"Bearer {ingest}", **inm})
            assert r.status_code == 403 and "etag" not in r.headers


def test_a_burst_of_async_reads_opens_at_most_size_connections(db_url: str) -> None:
    reads = AsyncReads(db_url, size=2)

    async def burst() -> list[int]:
        try:
            rows = await asyncio.gather(*(reads.fetchone("SELECT pg_backend_pid(), pg_sleep(0.02)")
                                          for _ in range(12)))
            return [r[0] for r in rows if r]
        finally:
            await reads.aclose()

    pids = asyncio.run(burst())
    assert len(pids) == 12 and len(set(pids)) == 2  # the others waited for one of the two
