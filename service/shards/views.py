"""The API side of a sharded deployment: fleet-wide reads say which pods they could not see.

Every response that aggregates telemetry across the fleet (`/series`, `/kpis`, `/summary`, `/topology`)
carries the `X-Fabricwatch-Missing-Pods` header and, in its JSON object, `missing_pods`: the pods of the
shards that did not answer ('(no pod)' for pod-less devices), empty when the answer is whole (always, on
one server).
"""

from __future__ import annotations

from typing import Any

from fastapi import Response
from sqlalchemy import Connection, Engine

from service.config import Settings
from service.shards.fleet import MISSING_HEADER, query_series
from service.shards.topology import Topology
from service.telemetry.ingest import IngestReport
from service.telemetry.service import SeriesResult


def _topology(engine: Engine, settings: Settings) -> Topology:
    return Topology.of(engine.url.render_as_string(hide_password=False), settings.shards)


def fleet_topology(engine: Engine, settings: Settings) -> Topology | None:
    """The shards a fleet-wide read goes across; None on one server (the single-server path)."""
    return _topology(engine, settings) if settings.shards.urls else None


def say_missing(response: Response, body: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    """The header and the body's `missing_pods` (the pods as the API names them, '(no pod)' for '')."""
    response.headers[MISSING_HEADER] = ",".join(missing)
    body["missing_pods"] = missing
    return body


def import_across_shards(engine: Engine, settings: Settings, body: bytes) -> IngestReport:
    """`POST /api/v1/import/prometheus` when shards are configured: each sample on its device's shard."""
    import time

    from service.shards.ingest import import_exposition

    report, _ = import_exposition(control=engine, topology=_topology(engine, settings), chunks=[body],
                                  source="body", default_ts_ms=int(time.time() * 1000),
                                  batch_rows=settings.ingest_batch_rows)
    return report


def series_across_shards(conn: Connection, settings: Settings, **query: Any) -> tuple[list[SeriesResult], list[str]]:
    """`/api/v1/series` when shards are configured: read through the fleet tables; the series, and the pods
    of the shards that did not answer (for `say_missing`)."""
    results, seen = query_series(conn=conn, topology=_topology(conn.engine, settings), **query)
    return results, seen.missing_shown
