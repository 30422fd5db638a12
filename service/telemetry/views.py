"""Telemetry endpoints: Prometheus-text import and series queries."""

from __future__ import annotations

import gzip
import zlib
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import Field
from pydantic_core import to_json
from sqlalchemy import Connection, Engine
from starlette.concurrency import run_in_threadpool

from service.api.auth import ReadScope, authorize, require
from service.api.deps import EngineDep, SettingsDep
from service.api.params import QueryModel, read_query, time_query, time_range
from service.api.problems import Problem
from service.config import Settings
from service.db import read_retrying
from service.inventory.schemas import EndpointProtocol
from service.observability import INGEST_ERRORS
from service.telemetry import catalogue
from service.telemetry.ingest import NothingStored
from service.telemetry.promtext import PromParseError
from service.telemetry.schemas import ImportReport, LinkCheckRead, SeriesRead, TargetsRead, TargetState
from service.telemetry.service import import_prometheus, query_series

router = APIRouter(prefix="/api/v1", tags=["telemetry"])


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise Problem(413, "Body too large", f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, "Body too large", f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    if request.headers.get("content-encoding", "").lower() == "gzip":
        try:
            decoder = zlib.decompressobj(wbits=31)
            body = decoder.decompress(body, limit + 1)
            if len(body) > limit or decoder.unconsumed_tail:
                raise Problem(413, "Body too large", f"decompressed body exceeds {limit} bytes")
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise Problem(400, "Malformed body", f"gzip: {exc}") from None
    return body


@router.post("/import/prometheus", summary="Import Prometheus text exposition (VictoriaMetrics-compatible)",
             dependencies=[Depends(require("ingest"))], response_model=ImportReport,
             openapi_extra={"requestBody": {"required": True, "content": {"text/plain": {"schema": {
                 "type": "string", "description": "Prometheus text exposition; Content-Encoding: gzip allowed"}}}}})
async def import_prom(request: Request, engine: EngineDep, settings: SettingsDep) -> dict[str, Any]:
    body = await _read_body(request, settings.max_body_bytes)
    try:
        body.decode("utf-8")  # refused whole, before anything is parsed
    except UnicodeDecodeError as exc:
        INGEST_ERRORS.labels(reason="encoding").inc()
        raise Problem(400, "Malformed body", f"body is not UTF-8 at byte {exc.start}") from None
    try:
        if settings.shards.urls:  # each sample on its device's shard (service/shards/ingest.py)
            from service.shards.views import import_across_shards

            report = await run_in_threadpool(import_across_shards, engine, settings, body)
        else:
            report = await run_in_threadpool(
                import_prometheus, engine=engine, chunks=[body], source="body",
                batch_rows=settings.ingest_batch_rows)
    except NothingStored as exc:  # well-formed, but every sample was refused: say why, with the counts
        raise Problem(422, "Nothing stored", str(exc), line=exc.line, reason=exc.reason,
                      report=exc.report.to_dict()) from None
    except PromParseError as exc:
        raise Problem(400, "Malformed exposition", str(exc), line=exc.line, reason=exc.reason) from None
    return report.to_dict()


class SeriesQuery(QueryModel):
    metric: str
    device: str | None = None
    port: str | None = None
    lane: Annotated[int | None, Field(ge=0)] = None
    priority: Annotated[int | None, Field(ge=0)] = None
    gpu: Annotated[int | None, Field(ge=0)] = None
    start: Annotated[str | None, time_query("from (default: end minus 1 h)")] = None
    end: Annotated[str | None, time_query("to (default: now)")] = None
    step: Annotated[float | None, Field(gt=0, le=86400 * 7)] = None
    raw: bool = False


# Registered before its documentation twin below, so it is the one that answers. It declares nothing for
# FastAPI to solve but the request: the parameters are one model validation (`read_query`), the scope check
# and the engine are read from the request (as for /alerts: service/alerts/views.py).
@router.get("/series", include_in_schema=False)
async def answer_series(request: Request) -> Response:
    await authorize(request, "read")
    q = read_query(request, SeriesQuery)
    return await run_in_threadpool(_series, request.app.state.engine, request.app.state.settings, q)


def warm(conn: Connection) -> None:
    """/series' reads once on this connection, at start-up (as alerts.views.warm): one stored series of
    the busiest metric over the last hour from samples, and over 3 days from the rollups."""
    now = datetime.now(UTC)
    for span in (timedelta(hours=1), timedelta(days=3)):
        query_series(conn=conn, metric="port_rx_bytes_total", start=now - span, end=now, max_series=1)


def _series(engine: Engine, settings: Settings, q: SeriesQuery) -> Response:
    response = Response()  # say_missing sets its header on it
    if catalogue.get(q.metric) is None:
        raise Problem(404, "Unknown metric", f"{q.metric!r} is not in the metric catalogue")
    t_start, t_end = time_range(q.start, q.end, timedelta(hours=1))
    query = {"metric": q.metric, "device": q.device, "port": q.port, "lane": q.lane, "priority": q.priority,
             "gpu": q.gpu, "start": t_start, "end": t_end, "step_s": q.step, "raw": q.raw}
    if settings.shards.urls:  # every shard, through the fleet tables; the header names pods not seen
        from service.shards.views import series_across_shards

        with engine.connect() as conn:
            results, missing = series_across_shards(conn, settings, **query)
    else:
        missing = []
        # Each statement reads its own snapshot either way (READ COMMITTED): without a transaction the
        # request saves the BEGIN and ROLLBACK round trips (docs/benchmarks.md, "Reads at 500 req/s").
        results = read_retrying(engine, lambda conn: query_series(conn=conn, **query))
    from service.shards.views import MISSING_HEADER, say_missing

    body = say_missing(response, {
        "metric": q.metric, "start": t_start.isoformat(), "end": t_end.isoformat(), "step": q.step,
        "series": [
            {"labels": {k: v for k, v in (("device", r.device), ("port", r.port), ("lane", r.lane),
                                          ("priority", r.priority), ("gpu", r.gpu)) if v is not None},
             "kind": r.kind, "unit": r.unit, "points": r.points}  # (ms, value) pairs, as the model reads them
            for r in results
        ],
    }, missing)
    # Serialized as is: the body is built in SeriesRead's shape from values of the right types (ints, floats,
    # None), so validating it first (FastAPI's response_model path, ~1.5 us a point) changes nothing; the JSON
    # is the same bytes (infinities and NaN as null, as the model writes them; test_series_json).
    return Response(to_json(body, inf_nan_mode="null"), media_type="application/json",
                    headers={MISSING_HEADER: response.headers[MISSING_HEADER]})


@router.get("/series", summary="Stored series; counters as per-second rates", response_model=SeriesRead)
def get_series(_: ReadScope, query: Annotated[SeriesQuery, Query()]) -> Response:
    raise AssertionError("documentation only: answer_series, registered first, answers GET /api/v1/series")


@router.get("/targets", summary="Collection targets and their last status", response_model=TargetsRead)
def get_targets(
    engine: EngineDep, settings: SettingsDep, response: Response, _: ReadScope, device: str | None = None,
    protocol: EndpointProtocol | None = None, pod: str | None = None,
    state: Annotated[list[TargetState] | None, Query()] = None,
) -> dict[str, Any]:
    from service.shards.views import fleet_topology, say_missing
    from service.telemetry.targets import list_targets

    shards = fleet_topology(engine, settings)
    with engine.connect() as conn:
        if shards is None:
            items, missing = list_targets(conn, device=device, protocol=protocol, pod=pod), []
        else:  # the blocked rules from each device's shard's detector state; a shard down is named
            from service.shards.views import blocked_across_shards

            blocked_of, down = blocked_across_shards(conn, shards)
            items = list_targets(conn, device=device, protocol=protocol, pod=pod, blocked_of=blocked_of)
            missing = sorted({t["pod"] or "" for t in items} & down)
    counts: dict[str, int] = {}
    for t in items:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    # the summary counts every state of the device/protocol/pod selection: how many are ok beside the failing
    return say_missing(response, {"targets": [t for t in items if not state or t["state"] in state],
                                  "summary": counts}, [p or "(no pod)" for p in missing])


@router.get("/linkcheck", summary="LLDP neighbours compared with the inventory's links", response_model=LinkCheckRead)
def get_linkcheck(engine: EngineDep, _: ReadScope) -> dict[str, Any]:
    from service.telemetry.targets import link_check

    with engine.connect() as conn:
        return link_check(conn)
