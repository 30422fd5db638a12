"""POST /api/v1/write (Prometheus remote write 1.0) and GET /api/v1/write/status."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy.exc
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.api.auth import ReadScope, require
from service.api.deps import EngineDep, SettingsDep
from service.api.problems import Problem
from service.shards.ingest import topology_of
from service.telemetry import remote_write as rw
from service.telemetry.views import _read_body

router = APIRouter(prefix="/api/v1", tags=["telemetry"])


class RemoteWriteStatus(BaseModel):
    """Since this process started (each API worker counts its own)."""

    requests: int = Field(description="requests answered, refused ones included")
    refused: dict[str, int] = Field(description="refused requests by status (400, 413, 415, 503)")
    samples: int = Field(description="samples received in accepted requests")
    written: int
    duplicates: int = Field(description="samples already stored (a resend)")
    unmapped: dict[str, int] = Field(description="samples not stored, by reason (docs/ecosystem.md)")
    unmapped_detail: dict[str, dict[str, int]] = Field(description="per reason, the most common metric names, "
                                                       "instances or device:port")
    last_request_at: float | None = Field(description="Unix seconds")
    last_error: str | None = Field(description="the last refusal's detail")

_RW2 = "io.prometheus.write.v2.request"


def _check_headers(request: Request) -> None:
    ctype = request.headers.get("content-type", "")
    media, _, params = ctype.partition(";")
    if media.strip().lower() != "application/x-protobuf":
        raise rw.RemoteWriteError(415, "Unsupported media type",
                                  f"Content-Type {ctype or '(none)'!r}: remote write sends application/x-protobuf")
    proto = dict(p.strip().lower().partition("=")[::2] for p in params.split(";") if "=" in p).get("proto")
    if proto not in (None, "prometheus.writerequest"):
        hint = " (remote write 2.0: set protobuf_message: prometheus.WriteRequest)" if proto == _RW2 else ""
        raise rw.RemoteWriteError(415, "Unsupported media type",
                                  f"proto={proto}: only prometheus.WriteRequest (remote write 1.0) is taken{hint}")
    enc = request.headers.get("content-encoding", "")
    if enc.strip().lower() != "snappy":
        raise rw.RemoteWriteError(415, "Unsupported media type",
                                  f"Content-Encoding {enc or '(none)'!r}: remote write bodies are snappy-compressed")


@router.post("/write", status_code=204, summary="Prometheus remote write 1.0 (snappy protobuf WriteRequest)",
             dependencies=[Depends(require("ingest"))],
             responses={204: {"description": "stored; X-Fabricwatch-* headers count what was not"},
                        400: {"description": "malformed: never retried"}, 413: {"description": "too large"},
                        415: {"description": "not remote write 1.0"}, 503: {"description": "store away: retry"}},
             openapi_extra={"requestBody": {"required": True, "content": {"application/x-protobuf": {"schema": {
                 "type": "string", "format": "binary",
                 "description": "snappy block-compressed prometheus.WriteRequest"}}}}})
async def remote_write(request: Request, engine: EngineDep, settings: SettingsDep) -> Response:
    try:
        _check_headers(request)
        body = await _read_body(request, settings.max_body_bytes)
        raw = rw.decompress(body, settings.max_body_bytes)
        # with shards, each series on its device's shard (service/shards/ingest.py)
        topology = topology_of(settings, engine.url.render_as_string(hide_password=False))
        report = await run_in_threadpool(rw.write, engine, raw, batch_rows=settings.ingest_batch_rows,
                                         topology=topology)
    except rw.RemoteWriteError as exc:
        rw.REMOTE_WRITE_REQUESTS.labels(str(exc.status)).inc()
        rw.TOTALS.refuse(exc.status, exc.detail)
        raise Problem(exc.status, exc.title, exc.detail) from None
    except Problem as exc:  # the body limit
        rw.REMOTE_WRITE_REQUESTS.labels(str(exc.status)).inc()
        rw.TOTALS.refuse(exc.status, str(exc.detail))
        raise
    except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:  # the store away: retried
        rw.REMOTE_WRITE_REQUESTS.labels("503").inc()
        rw.TOTALS.refuse(503, f"database: {exc}"[:300])
        raise Problem(503, "Database unavailable", "retry shortly; nothing was written",
                      headers={"Retry-After": "5"}) from None
    rw.REMOTE_WRITE_REQUESTS.labels("204").inc()
    return Response(status_code=204, headers=report.headers())


@router.get("/write/status", summary="What remote write received since this process started, and what it "
            "could not map (per reason)", response_model=RemoteWriteStatus)
def remote_write_status(_: ReadScope) -> dict[str, Any]:
    return rw.TOTALS.to_dict()
