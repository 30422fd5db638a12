"""Assemble the FastAPI application."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
import psycopg
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy import Connection, Engine, exc

from service import events
from service.alerts import listcache
from service.alerts import views as alert_views
from service.api import health, problems
from service.api.auth import Authenticate
from service.api.limits import BodyLimit
from service.api.timing import RequestTiming
from service.auth import views as auth_views
from service.config import Settings, get_settings
from service.db import AsyncReads, get_engine
from service.drains import views as drain_views
from service.fleet import views as fleet_views
from service.incidents import views as incident_views
from service.inventory import views as inventory_views
from service.kpis import views as kpi_views
from service.nccl import views as nccl_views
from service.noc import views as noc_views
from service.notify import am_views
from service.notify import views as notify_views
from service.observability import HEALTH, TARGET_COVERAGE
from service.shards.views import fleet_topology
from service.telemetry import remote_write_views
from service.telemetry import views as telemetry_views

# A request is matched against the routes in this order, one by one (FastAPI's matching costs a few us a
# route): the pollers' reads, /alerts and /series, come right after the probes. No path of theirs is also
# another router's (checked when this order was set, 2026-12-04).
ROUTERS = (health.router, alert_views.router, telemetry_views.router, noc_views.router, inventory_views.router,
           fleet_views.router, notify_views.router, am_views.router, am_views.status_router, incident_views.router,
           drain_views.router, kpi_views.router, nccl_views.router, auth_views.router, events.router,
           remote_write_views.router)

DOCS_ASSETS = "/docs/assets"
WARM_TIMEOUT_S = 10.0  # how long start-up waits for the database to open the pools' connections
log = logging.getLogger(__name__)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # As many threads for sync routes (nearly all of them use the database) as the pool keeps connections:
    # with anyio's 40 threads over a pool of 5, every burst over 5 requests opened connections and closed
    # them again as they came back, a new PostgreSQL backend each (35 a second at 400 req/s, growing with
    # the backlog: docs/benchmarks.md). The threads over the pool's size only waited for a connection.
    anyio.to_thread.current_default_thread_limiter().total_tokens = app.state.settings.api_db_threads
    # Everything imported and built so far lives as long as the process: out of the collector's sight, so a
    # full collection scans what requests left behind, not the ~170k objects of the modules and the app (~100
    # CPU ms each on the bench machine, the event loop stopped meanwhile: the reads' p99 at 500 req/s,
    # docs/benchmarks.md). Collected first, so no garbage of startup is kept.
    gc.collect()
    gc.freeze()
    await _warm_pools(app)
    yield
    await app.state.async_reads.aclose()
    await events.hub_for(app).aclose()  # open SSE streams must not hold the server's exit
    gc.unfreeze()  # a process that goes on without the app (a test) collects them as before


async def _warm_pools(app: FastAPI) -> None:
    """Open every connection the pools keep before the first request: opened under load instead, each new
    backend (connect, then its first statements) held a request and the ones queued behind it, the reads'
    p99 at 500 req/s for the first seconds after a start (docs/benchmarks.md). A database that does not
    answer is no reason not to start: the requests say so (503) until it does."""
    engine: Engine = app.state.engine
    reads: AsyncReads = app.state.async_reads

    def warm_sync() -> None:
        conns = []
        try:
            for _ in range(app.state.settings.api_db_threads):
                conns.append(engine.connect())
                conns[-1].exec_driver_sql("SELECT 1")
            for conn in conns:
                _warm_reads(conn)
        finally:
            for conn in conns:
                conn.close()

    try:
        with anyio.move_on_after(WARM_TIMEOUT_S) as scope:  # a server that accepts and never answers
            await anyio.to_thread.run_sync(warm_sync, abandon_on_cancel=True)
            await asyncio.gather(*(listcache.read_version_async(reads) for _ in range(reads.size)))
        if scope.cancelled_caught:
            log.warning("the database did not answer at start-up within %s s: its connections open as requests "
                        "need them", WARM_TIMEOUT_S)
    except (exc.SQLAlchemyError, psycopg.Error, OSError) as e:
        log.warning("the database did not answer at start-up (%s): its connections open as requests need them", e)


def _warm_reads(conn: Connection) -> None:
    """The pollers' reads (/alerts, /series) once on this pooled connection: a new backend's first statements
    and a process's first answers were the rest of the cold start's tail (docs/benchmarks.md). A read that
    fails here (a database not yet migrated) fails again for its request, which says why."""
    for path, views in (("/api/v1/alerts", alert_views), ("/api/v1/series", telemetry_views)):
        try:
            views.warm(conn)
        except exc.SQLAlchemyError as e:
            conn.rollback()
            log.warning("start-up: warming the reads of %s failed (%s); its first requests start cold", path, e)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if not settings.database_url:
        raise RuntimeError("create_app needs settings.database_url (the CLI starts the embedded default)")
    # /docs and /redoc load Swagger UI and ReDoc from the installed fastapi-offline package, never a CDN:
    # sites without internet get a working page. Open without a token, like /openapi.json and /metrics
    # (docs/api.md, "Access control").
    app = FastAPIOffline(title="fabricwatch", version="0.1.0", lifespan=_lifespan, static_url=DOCS_ASSETS,
                         description="Fabric telemetry and anomaly detection for GPU clusters.",
                         swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from swagger.io
                         # FastAPI's own OpenTelemetry hooks: unused here (metrics are /metrics'), yet asked on
                         # every request whether a provider was configured since.
                         telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.settings = settings
    app.state.engine = get_engine(settings.database_url, pool_size=settings.api_db_threads)
    app.state.async_reads = AsyncReads(settings.database_url)  # reads answered on the event loop (cached alert pages)
    TARGET_COVERAGE.engine = app.state.engine   # /metrics reads the targets' coverage from this database
    HEALTH.engine = app.state.engine            # and the alerts and receivers
    HEALTH.topology = fleet_topology(app.state.engine, settings)  # sharded: the shards' detector states
    problems.install(app)
    # The last added runs first: the token is checked before the body limit, and both before any body is read.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(Authenticate, settings=settings, engine=app.state.engine)
    app.add_middleware(RequestTiming)

    for router in ROUTERS:
        app.include_router(router)
    return app
