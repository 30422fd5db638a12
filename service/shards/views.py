"""The API side of a sharded deployment: fleet-wide reads say which pods they could not see."""

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


def import_across_shards(engine: Engine, settings: Settings, body: bytes) -> IngestReport:
    """`POST /api/v1/import/prometheus` when shards are configured: each sample on its device's shard."""
    import time

    from service.shards.ingest import import_exposition

    report, _ = import_exposition(control=engine, topology=_topology(engine, settings), chunks=[body],
                                  source="body", default_ts_ms=int(time.time() * 1000),
                                  batch_rows=settings.ingest_batch_rows)
    return report


def series_across_shards(conn: Connection, settings: Settings, response: Response, **query: Any) -> list[SeriesResult]:
    """`/api/v1/series` when shards are configured: read through the fleet tables, and name the pods of the
    shards that did not answer in the X-Fabricwatch-Missing-Pods header (empty when the answer is whole)."""
    results, seen = query_series(conn=conn, topology=_topology(conn.engine, settings), **query)
    response.headers[MISSING_HEADER] = ",".join(seen.missing_shown)
    return results
