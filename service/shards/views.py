"""The API side of a sharded deployment: fleet-wide reads say which pods they could not see."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from sqlalchemy import Connection

from service.config import Settings
from service.shards.fleet import MISSING_HEADER, query_series
from service.shards.topology import Topology
from service.telemetry.service import SeriesResult


def series_across_shards(conn: Connection, settings: Settings, response: Response, **query: Any) -> list[SeriesResult]:
    """`/api/v1/series` when shards are configured: read through the fleet tables, and name the pods of the
    shards that did not answer in the X-Fabricwatch-Missing-Pods header (empty when the answer is whole)."""
    topology = Topology.of(conn.engine.url.render_as_string(hide_password=False), settings.shards)
    results, seen = query_series(conn=conn, topology=topology, **query)
    response.headers[MISSING_HEADER] = ",".join(seen.missing_shown)
    return results
