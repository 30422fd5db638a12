"""Server-sent events over a real uvicorn server: delivery on commit only, NOTIFY from another
connection (as a Celery worker would), kind filters, heartbeats, Last-Event-ID replay and auth."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from sqlalchemy import Engine

from service import events
from service.auth.service import create_token
from service.config import load_settings
from tests import live_api as live
from tests.api.fabric_seed import empty, make_app


class Stream:
    """Read one SSE response on a thread; `next()` returns the next event or comment block."""

    def __init__(self, base: str, headers: dict[str, str] | None = None, params: dict[str, str] | None = None):
        self.blocks: queue.Queue[str | None] = queue.Queue()
        self._client = httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=30))
        self._cm = self._client.stream("GET", "/api/v1/events", headers=headers or {}, params=params or {})
        self.response = self._cm.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buf = ""
        try:
            for chunk in self.response.iter_text():
                buf += chunk
                while "\n\n" in buf:
                    block, buf = buf.split("\n\n", 1)
                    self.blocks.put(block)
        except (httpx.HTTPError, RuntimeError):
            pass
        self.blocks.put(None)

    def next(self, timeout: float = 10) -> str:
        block = self.blocks.get(timeout=timeout)
        assert block is not None, "stream ended"
        return block

    def next_event(self, timeout: float = 10) -> dict[str, str]:
        while True:
            block = self.next(timeout)
            fields = dict(line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":")
                          and ": " in line)
            if "event" in fields:
                return fields

    def close(self) -> None:
        # httpx does not close a socket that another thread is reading: shut it down under the reader.
        sock = self.response.extensions["network_stream"].get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self.response.close()
        self._client.close()


@pytest.fixture()
def api(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    empty(engine)
    monkeypatch.setattr(live, "create_app", make_app)
    with live.live_api(load_settings(database_url=db_url, auth_required=False)) as base:
        yield base


def _ready(s: Stream) -> None:
    assert ": ready" in s.next(), "the first block says LISTEN is in place"


def test_publish_is_delivered_on_commit_only(api: str, engine: Engine) -> None:
    s = Stream(api)
    try:
        assert s.response.headers["content-type"].startswith("text/event-stream")
        _ready(s)
        with engine.connect() as conn:
            tx = conn.begin()
            events.publish(conn, "alert", {"id": 1, "state": "firing"})
            tx.rollback()   # never committed: never delivered
        with engine.begin() as conn:
            events.publish(conn, "alert", {"id": 2, "state": "acknowledged"})
        ev = s.next_event()
        assert ev["event"] == "alert" and json.loads(ev["data"])["data"] == {"id": 2, "state": "acknowledged"}
        assert ev["id"].split("-")[1] == "1"
    finally:
        s.close()


def test_notify_from_another_process_and_kind_filter(api: str, db_url: str) -> None:
    s = Stream(api, params={"kinds": "drain,incident"})
    try:
        _ready(s)
        # A worker without our Python code: plain SQL on its own connection.
        with psycopg.connect(events.libpq_url(db_url), autocommit=True) as conn:
            conn.execute("SELECT pg_notify('fabricwatch_events', %s)", ['{"kind":"alert","data":{"id":9}}'])
            conn.execute("SELECT pg_notify('fabricwatch_events', %s)", ['{"kind":"drain","data":{"id":7}}'])
            conn.execute("SELECT pg_notify('fabricwatch_events', %s)", ["not json"])
        ev = s.next_event()
        assert ev["event"] == "drain" and json.loads(ev["data"])["data"] == {"id": 7}
    finally:
        s.close()


def test_heartbeat(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.4)
    monkeypatch.setattr(events, "POLL_S", 0.2)
    s = Stream(api)
    try:
        _ready(s)
        assert s.next(timeout=5) == ": keepalive"
    finally:
        s.close()


def test_last_event_id_replays_what_was_missed(api: str, engine: Engine) -> None:
    keeper = Stream(api)   # holds the listener while the other client is away
    try:
        _ready(keeper)
        first = Stream(api)
        _ready(first)
        with engine.begin() as conn:
            events.publish(conn, "incident", {"id": 1})
        last_id = first.next_event()["id"]
        first.close()
        for i in (2, 3):
            with engine.begin() as conn:
                events.publish(conn, "incident", {"id": i})
        assert json.loads(keeper.next_event()["data"])["data"]["id"] == 1
        assert json.loads(keeper.next_event()["data"])["data"]["id"] == 2
        assert json.loads(keeper.next_event()["data"])["data"]["id"] == 3
        again = Stream(api, headers={"Last-Event-ID": last_id})
        try:
            _ready(again)
            assert [json.loads(again.next_event()["data"])["data"]["id"] for _ in range(2)] == [2, 3]
        finally:
            again.close()
    finally:
        keeper.close()


def test_oversized_payload_becomes_a_reference() -> None:
    body = json.loads(events.encode("alert", {"id": 5, "evidence": "x" * 20_000}))
    assert body["data"] == {"id": 5, "truncated": True}


def test_events_need_read_scope(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.api import auth

    auth._failures.clear()
    empty(engine)
    with engine.begin() as conn:
        token = create_token(conn, name="sse-read", scopes=["read"])
    monkeypatch.setattr(live, "create_app", make_app)
    with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
        assert httpx.get(base + "/api/v1/events").status_code == 401
        s = Stream(base, headers={"authorization": f"Bearer {token}"})
        try:
            assert s.response.status_code == 200
            _ready(s)
        finally:
            s.close()
