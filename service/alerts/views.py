"""Alert endpoints: list/get/ack/resolve/comment, silences and maintenance windows (router `router`)."""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Annotated, Literal

import psycopg
from fastapi import APIRouter, Query, Request, Response
from pydantic import Field
from sqlalchemy import Connection, Engine, exc
from starlette.concurrency import run_in_threadpool

from service.alerts import listcache, service
from service.alerts.schemas import (
    AlertAction,
    AlertDetail,
    AlertEventRead,
    AlertPage,
    AlertRead,
    AlertState,
    CommentCreate,
    MaintenanceCreate,
    MaintenanceRead,
    MaintenanceUpdate,
    SilenceCreate,
    SilenceRead,
    SilenceUpdate,
)
from service.api.auth import OperateScope, ReadScope, authorize
from service.api.deps import EngineDep
from service.api.params import QueryModel, read_query
from service.api.problems import Problem
from service.db import AsyncReads, read_retrying
from service.detection.findings import Cause, Severity

router = APIRouter(prefix="/api/v1", tags=["alerts"])
log = logging.getLogger(__name__)

Sort = Literal["-created", "created", "-updated", "updated", "-opened", "opened"]


def _values(members: list[Severity] | list[Cause] | None) -> list[str] | None:
    return [m.value for m in members] if members else None


def _sorted(values: list[str] | None) -> tuple[str, ...] | None:
    """A filter's values in one order: the same filter in another order is the same cached page."""
    return tuple(sorted(set(values))) if values else None


def _not_found(what: str, ident: int) -> Problem:
    return Problem(404, "Not found", f"no {what} with id {ident}")


class AlertQuery(QueryModel):
    state: list[AlertState] | None = None
    severity: list[Severity] | None = None
    kind: list[str] | None = None
    device: list[str] | None = None
    pod: list[str] | None = None
    cause: list[Cause] | None = None
    sort: Sort = "-created"
    limit: Annotated[int, Field(ge=1, le=500)] = 100
    cursor: str | None = None


# Registered before its documentation twin below, so it is the one that answers. It declares nothing for
# FastAPI to solve (150 us of CPU a request for the nine parameters, ~20 us a dependency): the parameters are
# one model validation (`read_query`), the scope check and the engines are read from the request.
@router.get("/alerts", include_in_schema=False)
async def answer_alerts(request: Request) -> Response:
    await authorize(request, "read")
    q = read_query(request, AlertQuery)
    engine: Engine = request.app.state.engine
    reads: AsyncReads = request.app.state.async_reads
    filters = {"state": _sorted(q.state), "severity": _sorted(_values(q.severity)), "kind": _sorted(q.kind),
               "device": _sorted(q.device), "pod": _sorted(q.pod), "cause": _sorted(_values(q.cause))}
    key = (*filters.values(), q.sort, q.limit, q.cursor)
    body: bytes | None = None
    version: listcache.Version | None = None
    # A page held for this query needs only the version to be served: one statement on an async connection,
    # answered here on the event loop (no thread hop). A query this process never rendered (or not since the
    # version moved) skips it; so does a version read that failed twice (the sync path retries and answers 503).
    if listcache.PAGES.has(key):
        try:
            version = await listcache.read_version_async(reads)
        except (psycopg.Error, exc.SQLAlchemyError) as e:  # failed twice, no connection, or none came free
            log.warning("alert list: the version read on the event loop failed (%s); answering through the "
                        "thread pool", e)
            version = None
        body = listcache.PAGES.get(version, key) if version else None
    if body is None:
        body, version = await run_in_threadpool(_render, engine, filters, key, q.sort, q.limit, q.cursor)
    if version is None:
        return Response(body, media_type="application/json")
    tag = listcache.etag(version, key)
    headers = {"ETag": tag, "Cache-Control": listcache.CACHE_CONTROL}
    if listcache.matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get("/alerts", response_model=AlertPage, summary="Alerts, newest first; keyset-paginated",
            responses={304: {"description": "Not Modified: the If-None-Match ETag is still current"}})
async def list_alerts(_: ReadScope, query: Annotated[AlertQuery, Query()]) -> Response:
    """Sends an ETag that changes whenever any alert does (a cycle, an ack): `If-None-Match` with it
    gets 304 and no body while nothing changed (service/alerts/listcache.py)."""
    raise AssertionError("documentation only: answer_alerts, registered first, answers GET /api/v1/alerts")


def _render(engine: Engine, filters: dict[str, tuple[str, ...] | None], key: Hashable, sort: Sort, limit: int,
            cursor: str | None) -> tuple[bytes, listcache.Version | None]:
    """A page not held: rendered (and kept) on the thread pool, in one snapshot with the version it is of."""
    def read(conn: Connection) -> tuple[bytes, listcache.Version | None]:
        conn.execution_options(isolation_level="REPEATABLE READ")
        # One snapshot for the version and the page: the page is exactly the alerts of that version.
        version = listcache.read_version(conn)
        try:
            items, nxt = service.list_alerts(conn=conn, **{k: list(v) if v else None for k, v in filters.items()},
                                             sort=sort, limit=limit, cursor=cursor)
        except ValueError as exc:
            raise Problem(400, "Bad parameter", str(exc)) from None
        body = AlertPage(items=[AlertRead(**r) for r in items], next_cursor=nxt).model_dump_json().encode()
        if version:
            listcache.PAGES.put(version, key, body)
        return body, version

    return read_retrying(engine, read)


def warm(conn: Connection) -> None:
    """The list's reads once on this connection, at start-up: a new backend's first statements on a table
    (its catalog entries, its plans) cost 2-9 ms, and a process's first page ~15 ms more; under 500 req/s from
    a cold start they queued the pollers' reads for the first seconds (docs/benchmarks.md)."""
    listcache.read_version(conn)
    items, _ = service.list_alerts(conn=conn, limit=100)
    service.list_alerts(conn=conn, state=["firing"], device=[""], limit=100)  # a device's page
    AlertPage(items=[AlertRead(**r) for r in items], next_cursor=None).model_dump_json()


@router.get("/alerts/{alert_id}", response_model=AlertDetail, summary="One alert with its history")
def get_alert(alert_id: int, engine: EngineDep, _: ReadScope) -> AlertDetail:
    with engine.connect() as conn:
        row = service.get_alert(conn=conn, alert_id=alert_id, with_events=True)
    if row is None:
        raise _not_found("alert", alert_id)
    return AlertDetail(**row)


def _act(engine: EngineDep, alert_id: int, fn: str, actor: str, comment: str | None) -> AlertRead:
    try:
        with engine.begin() as conn:
            row = getattr(service, fn)(conn=conn, alert_id=alert_id, actor=actor, comment=comment)
    except service.AlertNotFound:
        raise _not_found("alert", alert_id) from None
    except service.AlertStateError as exc:
        raise Problem(409, "Conflict", str(exc)) from None
    return AlertRead(**row)


@router.post("/alerts/{alert_id}/ack", response_model=AlertRead, summary="Acknowledge (idempotent)")
def ack(alert_id: int, engine: EngineDep, who: OperateScope, body: AlertAction | None = None) -> AlertRead:
    return _act(engine, alert_id, "acknowledge", who.name, body.comment if body else None)


@router.post("/alerts/{alert_id}/resolve", response_model=AlertRead, summary="Resolve by hand (idempotent)")
def resolve(alert_id: int, engine: EngineDep, who: OperateScope, body: AlertAction | None = None) -> AlertRead:
    return _act(engine, alert_id, "resolve", who.name, body.comment if body else None)


@router.post("/alerts/{alert_id}/comments", response_model=AlertEventRead, status_code=201)
def comment(alert_id: int, body: CommentCreate, engine: EngineDep, who: OperateScope) -> AlertEventRead:
    try:
        with engine.begin() as conn:
            ev = service.add_comment(conn=conn, alert_id=alert_id, actor=who.name, comment=body.comment)
    except service.AlertNotFound:
        raise _not_found("alert", alert_id) from None
    return AlertEventRead(**ev)


# --- silences ---

@router.get("/silences", response_model=list[SilenceRead], tags=["silences"])
def list_silences(engine: EngineDep, _: ReadScope) -> list[SilenceRead]:
    with engine.connect() as conn:
        return [SilenceRead(**r) for r in service.list_silences(conn=conn)]


@router.post("/silences", response_model=SilenceRead, status_code=201, tags=["silences"])
def create_silence(body: SilenceCreate, engine: EngineDep, who: OperateScope) -> SilenceRead:
    with engine.begin() as conn:
        row = service.create_silence(conn=conn, matchers=[m.model_dump() for m in body.matchers],
                                     starts_at=body.starts_at, ends_at=body.ends_at, created_by=who.name,
                                     comment=body.comment)
    return SilenceRead(**row)


@router.get("/silences/{silence_id}", response_model=SilenceRead, tags=["silences"])
def get_silence(silence_id: int, engine: EngineDep, _: ReadScope) -> SilenceRead:
    with engine.connect() as conn:
        row = service.get_silence(conn=conn, silence_id=silence_id)
    if row is None:
        raise _not_found("silence", silence_id)
    return SilenceRead(**row)


@router.patch("/silences/{silence_id}", response_model=SilenceRead, tags=["silences"])
def update_silence(silence_id: int, body: SilenceUpdate, engine: EngineDep, _: OperateScope) -> SilenceRead:
    values = body.model_dump(exclude_none=True)  # null, like leaving a field out, keeps it as it is
    with engine.begin() as conn:
        current = service.get_silence(conn=conn, silence_id=silence_id)
        if current is None:
            raise _not_found("silence", silence_id)
        if values.get("starts_at", current["starts_at"]) >= values.get("ends_at", current["ends_at"]):
            raise Problem(422, "Invalid request", "ends_at must be after starts_at")
        row = service.update_silence(conn=conn, silence_id=silence_id, **values)
    return SilenceRead(**row)  # type: ignore[arg-type]


@router.delete("/silences/{silence_id}", status_code=204, tags=["silences"], summary="Expire now (kept)")
def expire_silence(silence_id: int, engine: EngineDep, _: OperateScope) -> Response:
    with engine.begin() as conn:
        if not service.expire_silence(conn=conn, silence_id=silence_id):
            raise _not_found("silence", silence_id)
    return Response(status_code=204)


# --- maintenance windows ---

@router.get("/maintenance", response_model=list[MaintenanceRead], tags=["maintenance"])
def list_maintenance(engine: EngineDep, _: ReadScope) -> list[MaintenanceRead]:
    with engine.connect() as conn:
        return [MaintenanceRead(**r) for r in service.list_maintenance(conn=conn)]


@router.post("/maintenance", response_model=MaintenanceRead, status_code=201, tags=["maintenance"])
def create_maintenance(body: MaintenanceCreate, engine: EngineDep, who: OperateScope) -> MaintenanceRead:
    with engine.begin() as conn:
        row = service.create_maintenance(conn=conn, device=body.device, port=body.port, starts_at=body.starts_at,
                                         ends_at=body.ends_at, created_by=who.name, comment=body.comment)
    return MaintenanceRead(**row)


@router.get("/maintenance/{window_id}", response_model=MaintenanceRead, tags=["maintenance"])
def get_maintenance(window_id: int, engine: EngineDep, _: ReadScope) -> MaintenanceRead:
    with engine.connect() as conn:
        row = service.get_maintenance(conn=conn, window_id=window_id)
    if row is None:
        raise _not_found("maintenance window", window_id)
    return MaintenanceRead(**row)


@router.patch("/maintenance/{window_id}", response_model=MaintenanceRead, tags=["maintenance"])
def update_maintenance(window_id: int, body: MaintenanceUpdate, engine: EngineDep,
                       _: OperateScope) -> MaintenanceRead:
    values = body.model_dump(exclude_none=True)  # null, like leaving a field out, keeps it as it is
    with engine.begin() as conn:
        current = service.get_maintenance(conn=conn, window_id=window_id)
        if current is None:
            raise _not_found("maintenance window", window_id)
        if values.get("starts_at", current["starts_at"]) >= values.get("ends_at", current["ends_at"]):
            raise Problem(422, "Invalid request", "ends_at must be after starts_at")
        row = service.update_maintenance(conn=conn, window_id=window_id, **values)
    return MaintenanceRead(**row)  # type: ignore[arg-type]


@router.delete("/maintenance/{window_id}", status_code=204, tags=["maintenance"], summary="End now (kept)")
def end_maintenance(window_id: int, engine: EngineDep, _: OperateScope) -> Response:
    with engine.begin() as conn:
        if not service.end_maintenance(conn=conn, window_id=window_id):
            raise _not_found("maintenance window", window_id)
    return Response(status_code=204)
