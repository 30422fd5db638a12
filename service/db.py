"""Database engine and sessions (SQLAlchemy 2 on psycopg 3)."""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event, exc, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.util import greenlet_spawn

T = TypeVar("T")


class Base(DeclarativeBase):
    pass


def normalize_url(url: str) -> str:
    """Point plain postgresql:// URLs at the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


_engines: dict[str, Engine] = {}


def get_engine(url: str, *, pool_size: int = 5) -> Engine:
    """One pooled engine per URL for the life of the process; `pool_size` (the connections it keeps) is the
    first caller's. Up to 10 more are opened under load and closed as they come back."""
    url = normalize_url(url)
    engine = _engines.get(url)
    if engine is None:
        # No pool_pre_ping: its round trip was a share of every API read (docs/benchmarks.md, "Reads at 500
        # req/s"). A checkout looks at the socket instead (`_check_out`), and reads retry (`read_retrying`).
        engine = create_engine(url, pool_size=pool_size, max_overflow=10)
        event.listen(engine, "checkout", _check_out)
        _engines[url] = engine
    return engine


def _check_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """A pooled connection's health without a round trip. An idle connection's socket has nothing to read
    unless the server spoke unasked: a backend that ends (a restart, pg_terminate_backend, an idle timeout)
    sends its FATAL error and closes. Then, and only then, ping it; a dead one makes the pool replace every
    connection older than now (a restart ended them all). A connection that dies after this check fails its
    statement: reads retry that (`read_retrying`, `AsyncReads`), writes fail as they would mid-transaction.
    The same for the asyncio engine's connections (`AsyncReads`): its checkout runs in SQLAlchemy's greenlet,
    where the adapter's cursor waits as a plain one does."""
    raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)  # the asyncio adapter's AsyncConnection
    if not isinstance(raw, psycopg.Connection | psycopg.AsyncConnection):
        return
    if raw.closed:
        raise exc.DisconnectionError("connection closed")
    try:
        poller = select.poll()
        poller.register(raw.pgconn.socket, select.POLLIN)
        if not poller.poll(0):
            return
        cur = dbapi_connection.cursor()  # a notice or a parameter change is read by this too
        try:
            cur.execute("SELECT 1")
        finally:
            cur.close()
        if not dbapi_connection.autocommit:
            dbapi_connection.rollback()
    except psycopg.Error as e:
        raise exc.InvalidatePoolError(f"connection ended by the server: {e}") from e


def read_retrying(engine: Engine, read: Callable[[Connection], T]) -> T:
    """`read(conn)` on an autocommit connection; once more on a new one if the server ended the connection
    under it (restarted, or the backend was terminated between the checkout and the statement). Only for
    reads: `read` may run twice."""
    for attempt in (1, 2):
        conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        raw = conn.connection.driver_connection
        try:
            return read(conn)
        except (exc.DBAPIError, psycopg.OperationalError):
            if attempt == 2 or not (isinstance(raw, psycopg.Connection) and raw.closed):
                raise
            conn.invalidate()  # not back into the pool; the others are checked at their checkout
        finally:
            conn.close()
    raise AssertionError("unreachable")


class AsyncReads:
    """One-statement reads for `async def` routes on SQLAlchemy's asyncio engine (psycopg 3's
    `AsyncConnection`): no trip through the thread pool (about 180 us of CPU a request, docs/benchmarks.md
    "Reads at 500 req/s").

    At most `size` autocommit connections (no overflow), opened as reads need them and kept; a read waits up
    to `wait_s` for one while `size` reads are on the server (a burst never opens more backends), then fails.
    A connection the server ended (a restart, pg_terminate_backend) is found at checkout by its socket, as
    the sync pool's are (`_check_out`: then every older one is replaced too); a read whose connection dies
    after that runs once more, on a new one. An engine belongs to the event loop that opened its connections:
    a read on another loop (a test client without its lifespan starts one per request) closes them and starts
    a new engine. Backends are named `APP_NAME` (pg_stat_activity) unless the URL names them."""

    APP_NAME = "fabricwatch-api-async"

    def __init__(self, url: str, *, size: int = 4, wait_s: float = 10.0) -> None:
        self.url = make_url(normalize_url(url))
        self.size, self.wait_s = size, wait_s
        self._engine: AsyncEngine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def engine(self) -> AsyncEngine | None:
        """The engine of the current event loop (None before the first read)."""
        return self._engine

    async def fetchone(self, query: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        """The first row of `query` (SQL with psycopg's `%(name)s` placeholders), or None. The statement runs
        on the pooled psycopg connection itself: SQLAlchemy's statement and result layers cost about 250 us of
        CPU more per read (docs/benchmarks.md, 2026-12-04); the pool and its checkout check are SQLAlchemy's.
        Raises psycopg's errors (the read failed twice) and SQLAlchemy's (no connection: refused, or none
        came free in `wait_s`)."""
        engine = await self._engine_for(asyncio.get_running_loop())
        for attempt in (1, 2):
            proxied = await engine.raw_connection()  # a connection the server ended is replaced here (_check_out)
            conn: psycopg.AsyncConnection[Any] = proxied.driver_connection  # type: ignore[assignment]
            try:
                cur = await conn.execute(query, params)
                row = await cur.fetchone()
            except psycopg.Error:
                broken = conn.broken  # ended by the server under the read, after the checkout's check
                await greenlet_spawn(proxied.invalidate)
                if attempt == 2 or not broken:
                    raise
                continue
            except BaseException:  # cancelled mid-statement: the connection's state is unknown
                await greenlet_spawn(proxied.invalidate)
                raise
            proxied.close()  # back to the pool: a queue put (no reset, autocommit; no overflow to close)
            return row
        raise AssertionError("unreachable")

    async def _engine_for(self, loop: asyncio.AbstractEventLoop) -> AsyncEngine:
        if self._engine is None or loop is not self._loop:
            await self.aclose()
            connect_args = {} if "application_name" in self.url.query else {"application_name": self.APP_NAME}
            # AUTOCOMMIT: a read is one statement, with no BEGIN or ROLLBACK round trips; nothing to reset.
            self._engine = create_async_engine(self.url, pool_size=self.size, max_overflow=0,
                                               pool_timeout=self.wait_s, isolation_level="AUTOCOMMIT",
                                               pool_reset_on_return=None, connect_args=connect_args)
            event.listen(self._engine.sync_engine, "checkout", _check_out)
            self._loop = loop
        return self._engine

    async def aclose(self) -> None:
        """Close the idle connections (a read still running closes its own as it ends)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()


def forget_engines_after_fork() -> None:
    """In a forked child: empty pools of its own; the pooled connections stay the parent's, unclosed."""
    for engine in _engines.values():
        engine.dispose(close=False)


def dispose_engines() -> None:
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    session = sessionmaker(bind=engine, expire_on_commit=False)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
