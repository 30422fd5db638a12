"""Change events for live clients: publish inside a transaction, fan out to SSE streams.

Publishing (any process: API, Celery worker, CLI)::

    from service.events import publish
    with engine.begin() as conn:
        ...change an alert...
        publish(conn, "alert", {"id": alert_id, "state": "acknowledged"})

`publish` runs `pg_notify('fabricwatch_events', <json>)` on the caller's connection, so the
event is delivered only when (and if) that transaction commits; a rollback drops it. Anything
else that can run SQL may do the same by hand::

    SELECT pg_notify('fabricwatch_events', '{"kind": "drain", "data": {"id": 7, "status": "pending"}}');

Kinds in use: `alert`, `drain`, `incident`, `target` (KINDS); others pass through unchanged.
Payloads should be small references (ids and the new state): clients re-read the resource.
PostgreSQL caps a NOTIFY payload at 8000 bytes, so `publish` replaces an oversized payload
with `{"id": ..., "truncated": true}` rather than fail the caller's transaction.

Receiving: each API process keeps one `EventHub` (per app). While at least one SSE client is
connected, the hub holds a dedicated psycopg connection that LISTENs on the channel
(reconnecting with backoff) and fans every notification out to the clients' queues. It
numbers events `<epoch>-<seq>` and keeps the last `REPLAY` of them, so a client that
reconnects with `Last-Event-ID` from this process gets what it missed; an id from another
epoch (the API restarted) or one older than the buffer replays nothing, and the client
should re-read state. `EventHub.publish_local` delivers an event to this process's clients
without PostgreSQL (for changes that have no transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import Connection, make_url, text

from service.api.auth import ReadScope
from service.api.problems import invalid_param

CHANNEL = "fabricwatch_events"
KINDS = ("alert", "drain", "incident", "target")
MAX_PAYLOAD = 7900      # bytes; PostgreSQL's NOTIFY limit is 8000
REPLAY = 1000           # events kept per process for Last-Event-ID
QUEUE_MAX = 1000        # per client; a client that falls this far behind is disconnected

log = logging.getLogger(__name__)


def encode(kind: str, payload: dict[str, Any]) -> str:
    """The NOTIFY payload for one event (JSON), cut down to a reference if it is too large."""
    msg = {"kind": kind, "data": payload, "at": datetime.now(UTC).isoformat()}
    body = json.dumps(msg, separators=(",", ":"), default=str)
    if len(body.encode()) > MAX_PAYLOAD:
        msg["data"] = {"id": payload.get("id"), "truncated": True}
        body = json.dumps(msg, separators=(",", ":"), default=str)
    return body


def publish(conn: Connection, kind: str, payload: dict[str, Any]) -> None:
    """Queue an event in the caller's transaction; PostgreSQL delivers it on commit only."""
    # A backtest replays alert changes with fabricwatch.replay set; those must not reach live clients.
    conn.execute(text("SELECT pg_notify(:ch, :msg) WHERE coalesce(current_setting('fabricwatch.replay', true), "
                      "'') <> 'on'"), {"ch": CHANNEL, "msg": encode(kind, payload)})


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    kind: str
    data: dict[str, Any]
    at: str | None = None

    def sse(self) -> str:
        """The event in text/event-stream framing."""
        data = json.dumps({"kind": self.kind, "data": self.data, "at": self.at}, separators=(",", ":"))
        return f"id: {self.id}\nevent: {self.kind}\ndata: {data}\n\n"


def parse(raw: str) -> tuple[str, dict[str, Any], str | None]:
    """(kind, data, at) from a NOTIFY payload; junk from a hand-written NOTIFY becomes kind 'unknown'."""
    try:
        msg = json.loads(raw)
    except ValueError:
        return "unknown", {"raw": raw[:500]}, None
    if not isinstance(msg, dict):
        return "unknown", {"raw": msg}, None
    kind = msg.get("kind")
    data = msg.get("data")
    return (str(kind) if kind else "unknown", data if isinstance(data, dict) else {"value": data},
            msg.get("at") if isinstance(msg.get("at"), str) else None)


def libpq_url(database_url: str) -> str:
    """A SQLAlchemy-style URL as psycopg wants it (no '+psycopg' driver suffix)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class EventHub:
    """One process's fan-out: a LISTEN connection feeding per-client asyncio queues."""

    def __init__(self, database_url: str, *, reconnect_s: float = 1.0) -> None:
        self._url = libpq_url(database_url)
        self._reconnect_s = reconnect_s
        self.epoch = secrets.token_hex(4)
        self._seq = itertools.count(1)
        self._recent: deque[Event] = deque(maxlen=REPLAY)
        self._clients: set[asyncio.Queue[Event | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()  # set while the LISTEN is in place (tests wait on it)

    @property
    def clients(self) -> int:
        return len(self._clients)

    def _deliver(self, kind: str, data: dict[str, Any], at: str | None) -> Event:
        ev = Event(f"{self.epoch}-{next(self._seq)}", kind, data, at)
        self._recent.append(ev)
        for q in list(self._clients):
            try:
                q.put_nowait(ev)
            except asyncio.QueueFull:
                # A stalled client must not hold memory for ever: end its stream, it will reconnect.
                self._clients.discard(q)
                with contextlib.suppress(asyncio.QueueFull):
                    q.get_nowait()
                    q.put_nowait(None)
        return ev

    def publish_local(self, kind: str, data: dict[str, Any]) -> Event:
        """Deliver to this process's clients only (no transaction, no other processes)."""
        return self._deliver(kind, data, datetime.now(UTC).isoformat())

    def replay_after(self, last_id: str | None) -> list[Event]:
        """Buffered events after `last_id`, when it came from this process and is still buffered."""
        if not last_id:
            return []
        epoch, _, seq = last_id.partition("-")
        if epoch != self.epoch or not seq.isdigit() or not self._recent:
            return []
        n = int(seq)
        first = int(self._recent[0].id.rpartition("-")[2])
        if n < first - 1:
            return []  # the gap is older than the buffer: the client must re-read state
        return [e for e in self._recent if int(e.id.rpartition("-")[2]) > n]

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Event | None]]:
        """A queue of events for one client; the first subscriber starts the LISTEN."""
        q: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=QUEUE_MAX)
        self._clients.add(q)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="fabricwatch-events-listen")
        try:
            yield q
        finally:
            self._clients.discard(q)
            if not self._clients and self._task is not None:
                # Nobody is watching: give the connection back rather than hold it idle.
                self._task.cancel()
                self._task = None
                self.listening.clear()

    async def _listen(self) -> None:
        delay = self._reconnect_s
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    delay = self._reconnect_s
                    async for note in conn.notifies():
                        self._deliver(*parse(note.payload))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: keep trying, clients keep their streams
                log.warning("event listener lost its connection (%s); retrying in %.1fs", exc, delay)
            self.listening.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def aclose(self) -> None:
        """End every stream and the LISTEN (call from a shutdown hook: open streams delay a server's exit)."""
        for q in list(self._clients):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None


# ---------------------------------------------------------------------------- SSE endpoint

HEARTBEAT_S = 15.0   # a comment line this often keeps proxies and load balancers from closing the stream
READY_WAIT_S = 5.0
POLL_S = 0.5         # how often an idle stream checks that its client is still there

router = APIRouter(prefix="/api/v1", tags=["events"])


def hub_for(app: Any) -> EventHub:
    """The app's hub, made on first use (create_app need not know about it)."""
    hub = getattr(app.state, "event_hub", None)
    if hub is None:
        hub = EventHub(app.state.settings.database_url)
        app.state.event_hub = hub
    return hub


def _seq(event_id: str) -> int:
    return int(event_id.rpartition("-")[2])


async def _stream(request: Request, hub: EventHub, kinds: set[str] | None,
                  last_id: str | None) -> AsyncIterator[str]:
    async with hub.subscribe() as q:
        # The first line is sent once LISTEN is in place: a client that has read it misses nothing after.
        try:
            await asyncio.wait_for(hub.listening.wait(), READY_WAIT_S)
            yield f"retry: 3000\n: ready epoch={hub.epoch}\n\n"
        except TimeoutError:
            yield "retry: 3000\n: waiting for the database\n\n"
        sent = 0
        for ev in hub.replay_after(last_id):
            sent = _seq(ev.id)
            if kinds is None or ev.kind in kinds:
                yield ev.sse()
        quiet = 0.0
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), POLL_S)
            except TimeoutError:
                # Under ASGI 2.4 nothing cancels us when the client goes: look every POLL_S, so a
                # closed stream frees its queue (and lets the server shut down) within a second.
                if await request.is_disconnected():
                    return
                quiet += POLL_S
                if quiet >= HEARTBEAT_S:
                    quiet = 0.0
                    yield ": keepalive\n\n"
                continue
            if ev is None:
                return  # this client fell too far behind; it reconnects with Last-Event-ID
            if _seq(ev.id) <= sent:
                continue  # already sent from the replay buffer
            if kinds is None or ev.kind in kinds:
                yield ev.sse()


def parse_kinds(kinds: str | None) -> set[str] | None:
    """The `kinds` filter as a set (None: every kind); a kind outside KINDS is a 422 naming the allowed ones."""
    if kinds is None:
        return None
    wanted = {k.strip() for k in kinds.split(",") if k.strip()}
    unknown = sorted(wanted - set(KINDS))
    if unknown or not wanted:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5]) if unknown else "nothing"
        raise invalid_param("kinds", f"{shown} is not an event kind; allowed: {', '.join(KINDS)} (comma-separated)")
    return wanted


@router.get("/events", summary="Server-sent events: alert, drain, incident and target changes",
            response_class=StreamingResponse,
            responses={200: {"description": "an endless text/event-stream (docs/api.md, Server-sent events)",
                             "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
async def get_events(
    request: Request,
    _: ReadScope,
    kinds: Annotated[str | None, Query(description=f"comma-separated, from {', '.join(KINDS)}; default all")] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    wanted = parse_kinds(kinds)
    last = last_event_id or request.query_params.get("last_event_id")
    return StreamingResponse(_stream(request, hub_for(request.app), wanted, last), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
