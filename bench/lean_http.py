"""A lean HTTP/1.1 GET client for bench/load.py's open-loop generator: keep-alive connections on raw
asyncio transports, responses parsed by httptools (uvicorn's own C parser).

Why not aiohttp: measured on the 2-core bench machine (docs/benchmarks.md, "Reads at 500 req/s", fourth
session), aiohttp spent 0.45-0.6 CPU ms per request in the load generator (URL building, multidicts,
its response object), 0.25 of the two cores at 500 req/s that the server under test then did not have.
This client does only what the bench needs: GET, a few request headers, the status, the ETag and the body's
length. No pipelining: a connection carries one request at a time, as a browser's does; a request waits
for a free connection when `limit` are busy (that wait counts in its latency, as it would with aiohttp).
Standard tools were considered: wrk, hey and autocannon (the ones packaged here) are closed loop, so a
server that falls behind slows the generator instead of showing it (coordinated omission); wrk2 and
vegeta, which are open loop, are not packaged here.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlencode

import httptools


class RequestFailed(Exception):
    """The connection closed or broke before a whole response came back."""


@dataclass
class Answer:
    status: int
    etag: str | None
    body_bytes: int


@dataclass
class _Parsing:
    waiter: asyncio.Future[Answer]
    etag: str | None = None
    body_bytes: int = 0
    done: bool = False
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.current: _Parsing | None = None
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (asyncio's or uvloop's)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RequestFailed(f"bad response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(RequestFailed("connection closed before the response ended"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.current is not None and name.lower() == b"etag":
            self.current.etag = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        if self.current is not None:
            self.current.body_bytes += len(body)

    def on_message_complete(self) -> None:
        cur, self.current = self.current, None
        if cur is not None and not cur.waiter.done():
            cur.waiter.set_result(Answer(self.parser.get_status_code(), cur.etag, cur.body_bytes))
        if not self.parser.should_keep_alive():
            self.close()

    def _fail(self, exc: Exception) -> None:
        cur, self.current = self.current, None
        if cur is not None and not cur.waiter.done():
            cur.waiter.set_exception(exc)

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None and self.current is None
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.current = _Parsing(waiter)
        self.transport.write(request)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class LeanClient:
    """GETs against one host:port over at most `limit` keep-alive connections."""

    def __init__(self, host: str, port: int, *, limit: int = 512, timeout_s: float = 10.0) -> None:
        self.host, self.port, self.limit, self.timeout_s = host, port, limit, timeout_s
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiting = 0
        self._free = asyncio.Condition()
        self._host_header = f"Host: {host}:{port}\r\n".encode()

    @staticmethod
    def target(path: str, params: dict[str, str] | None = None) -> str:
        return f"{path}?{urlencode(params)}" if params else path

    def _request(self, target: str, headers: dict[str, str] | None) -> bytes:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode("latin-1")
        return b"GET " + target.encode() + b" HTTP/1.1\r\n" + self._host_header + extra + b"\r\n"

    async def _acquire(self) -> tuple[_Connection, bool]:
        """A connection, and whether it is an idle one used before (which the server may have closed)."""
        while True:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn, True
                self._open -= 1
            if self._open < self.limit:
                self._open += 1
                try:
                    _, conn = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
                except OSError:
                    self._open -= 1
                    raise
                return conn, False
            async with self._free:
                self._waiting += 1
                try:
                    await self._free.wait()
                finally:
                    self._waiting -= 1

    async def _release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._open -= 1
        if self._waiting:
            async with self._free:
                self._free.notify()

    async def get(self, target: str, headers: dict[str, str] | None = None) -> Answer:
        """One GET of `target` (path and query); `TimeoutError` after `timeout_s` in all, `RequestFailed` or
        `OSError` when no response came. A keep-alive connection the server closed while it sat idle is
        retried once on a new one (what aiohttp does for a GET too)."""
        request = self._request(target, headers)
        async with asyncio.timeout(self.timeout_s):
            for attempt in (1, 2):
                conn, reused = await self._acquire()
                ok = False
                try:
                    answer = await conn.send(request)
                    ok = True
                    return answer
                except RequestFailed:
                    if attempt == 2 or not reused:
                        raise
                finally:
                    await self._release(conn, ok)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.aclose()
