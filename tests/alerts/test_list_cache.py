"""Alert list ETags and the per-process page cache: 304 while nothing changed, never a stale page.

The validator is `alerts_version`, moved by a trigger in every transaction that writes alerts (migration
0210): these tests write through the service (a cycle, an ack) and through plain SQL on another
connection (another process), and check what a client gets back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.alerts import listcache
from service.alerts.listcache import PageCache, Version
from service.api import auth
from service.auth.service import create_token
from tests.alerts import STEP, T0, finding
from tests.alerts.test_api import make_app, open_alerts


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    with TestClient(make_app(db_url, auth_required=False)) as c:
        yield c


def _get(client: TestClient, etag: str | None = None, **params: object):  # type: ignore[no-untyped-def]
    return client.get("/api/v1/alerts", params=params, headers={"if-none-match": etag} if etag else {})


def test_304_while_nothing_changes_and_a_new_etag_after_a_cycle(client: TestClient, db: Engine) -> None:
    open_alerts(db, 5)
    first = _get(client, limit=3)
    tag = first.headers["etag"]
    assert first.status_code == 200 and len(first.json()["items"]) == 3
    assert first.headers["cache-control"] == "private, no-cache"
    again = _get(client, tag, limit=3)
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
    assert _get(client, f'W/{tag}, "other"', limit=3).status_code == 304  # weak comparison, a list
    assert _get(client, "*", limit=3).status_code == 304
    # Another query has another tag; a tag of one query never validates another.
    other = _get(client, limit=4)
    assert other.headers["etag"] != tag and _get(client, tag, limit=4).status_code == 200
    # A detection cycle that changes alerts (a new one opens, the others are seen again).
    with db.begin() as conn:
        from service.alerts.service import apply_findings

        fs = [finding(port=f"Ethernet{i}", at_ms=T0 + STEP) for i in range(6)]
        apply_findings(conn=conn, findings=fs, at_ms=T0 + STEP, kinds=[fs[0].kind])
    after = _get(client, tag, limit=3)
    assert after.status_code == 200 and after.headers["etag"] != tag
    assert [a["port"] for a in after.json()["items"]][0] == "Ethernet5"


def test_never_a_stale_page_after_an_ack(client: TestClient, db: Engine) -> None:
    open_alerts(db, 3)
    page = _get(client, state="firing")
    tag, ids = page.headers["etag"], [a["id"] for a in page.json()["items"]]
    assert len(ids) == 3 and _get(client, tag, state="firing").status_code == 304
    assert client.post(f"/api/v1/alerts/{ids[0]}/ack").status_code == 200
    # The cached page of the old version is never served: with the old tag or without one.
    for etag in (tag, None):
        r = _get(client, etag, state="firing")
        assert r.status_code == 200 and r.headers["etag"] != tag
        assert [a["id"] for a in r.json()["items"]] == ids[1:]
    acked = _get(client, state="acknowledged").json()["items"]
    assert [(a["id"], a["state"]) for a in acked] == [(ids[0], "acknowledged")]


def test_a_write_from_another_process_shows_at_its_commit_and_a_rollback_changes_nothing(
        client: TestClient, db: Engine) -> None:
    open_alerts(db, 2)
    first = _get(client)
    tag = first.headers["etag"]
    with db.connect() as conn:  # a worker elsewhere: plain SQL, no code of this process involved
        conn.execute(text("UPDATE alerts SET summary = 'changed elsewhere' WHERE id = 1"))
        # Not committed yet: readers still get the old page, and it is still current.
        assert _get(client, tag).status_code == 304
        conn.rollback()
    assert _get(client, tag).status_code == 304
    with db.begin() as conn:
        conn.execute(text("UPDATE alerts SET summary = 'changed elsewhere' WHERE id = 1"))
    r = _get(client, tag)
    assert r.status_code == 200 and r.headers["etag"] != tag
    assert {a["summary"] for a in r.json()["items"] if a["id"] == 1} == {"changed elsewhere"}


def test_every_process_renders_the_same_bytes_under_one_etag(client: TestClient, db: Engine) -> None:
    open_alerts(db, 4)
    a = _get(client, state=["resolved", "firing"], limit=2)
    listcache.PAGES.clear()  # what another worker process, with nothing cached, would do
    b = _get(client, state=["firing", "resolved", "firing"], limit=2)  # the same filter written differently
    assert a.status_code == b.status_code == 200
    assert a.headers["etag"] == b.headers["etag"] and a.content == b.content


def test_truncate_starts_a_new_epoch(client: TestClient, db: Engine) -> None:
    open_alerts(db, 2)
    tag = _get(client).headers["etag"]
    with db.begin() as conn:
        conn.execute(text("TRUNCATE alerts, alerts_version RESTART IDENTITY CASCADE"))  # as a reset or restore
    open_alerts(db, 2)  # the same ids, version counter back at its start
    r = _get(client, tag)
    assert r.status_code == 200 and r.headers["etag"] != tag


def test_a_bad_cursor_is_refused_even_with_pages_cached(client: TestClient, db: Engine) -> None:
    open_alerts(db, 3)
    assert _get(client, limit=1).status_code == 200
    r = _get(client, limit=1, cursor="not-a-cursor")
    assert r.status_code == 400 and r.json()["detail"] == "malformed cursor"
    assert r.headers["content-type"].startswith("application/problem+json") and "etag" not in r.headers


def test_auth_and_scope_come_before_the_etag(db: Engine, db_url: str) -> None:
    auth._failures.clear()
    open_alerts(db, 1)
    with db.begin() as conn:
        read = create_token(conn, name="reader", scopes=["read"])
        ingest = create_token(conn, name="pusher", scopes=["ingest"])
    with TestClient(make_app(db_url, auth_required=True)) as c:
        ok = c.get("/api/v1/alerts", headers={"authorization": f"Bearer {read}"})
        tag = ok.headers["etag"]
        assert c.get("/api/v1/alerts", headers={"authorization": f"Bearer {read}",
                                                "if-none-match": tag}).status_code == 304
        assert c.get("/api/v1/alerts", headers={"if-none-match": tag}).status_code == 401
        assert c.get("/api/v1/alerts", headers={"authorization": f"Bearer {ingest}",
                                                "if-none-match": tag}).status_code == 403


def test_page_cache_keeps_newer_pages_and_its_byte_bound() -> None:
    import uuid

    epoch = uuid.uuid4()
    cache = PageCache(max_bytes=10)
    cache.put(Version(epoch, 2), "a", b"new")
    cache.put(Version(epoch, 1), "b", b"old")  # a request that read the version before a commit
    assert cache.get(Version(epoch, 2), "a") == b"new" and cache.get(Version(epoch, 1), "b") is None
    cache.put(Version(epoch, 2), "c", b"123456")
    cache.put(Version(epoch, 2), "d", b"1234")  # 3 + 6 + 4 > 10: the least recently used goes
    assert cache.get(Version(epoch, 2), "a") is None and cache.get(Version(epoch, 2), "d") == b"1234"
    cache.put(Version(epoch, 2), "e", b"x" * 11)  # larger than the whole cache: not kept
    assert cache.get(Version(epoch, 2), "e") is None
    cache.put(Version(uuid.uuid4(), 1), "f", b"f")  # a new epoch replaces everything
    assert len(cache) == 1
