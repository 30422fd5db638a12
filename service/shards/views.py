"""The API side of a sharded deployment: fleet-wide reads say which pods they could not see.

Every response that reads telemetry or detector state across shards (`/series`, `/kpis`, `/summary`,
`/topology`, `/optics`, `/devices/{name}`, `/targets`) carries the `X-Fabricwatch-Missing-Pods` header and,
in its JSON object, `missing_pods`: the pods of the shards that did not answer ('(no pod)' for pod-less
devices), empty when the answer is whole (always, on one server).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from fastapi import Response
from sqlalchemy import Connection, Engine, make_url, text
from sqlalchemy.exc import DBAPIError

from service.config import Settings
from service.db import get_engine, normalize_url
from service.shards.fleet import _DOWN, MISSING_HEADER, RECHECK_S, pod_map, query_series
from service.shards.topology import Topology
from service.telemetry.coverage import _read_blocked
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


# --- each shard's own database: its detector state (/targets' blocked rules, /api/v1/metrics) --------------

T = TypeVar("T")
_BLOCKED: dict[tuple[str, str], tuple[Any, dict[str, list[dict[str, Any]]]]] = {}  # (url, name) -> (saved, rules)
_BLOCKED_LOCK = threading.Lock()


def shard_engine(topology: Topology, shard: str) -> Engine:
    """The shard's pooled engine, with the topology's connect timeout unless its URL sets one: a shard that
    does not answer at all costs a read that long, not the kernel's timeout."""
    url = make_url(normalize_url(topology.url(shard)))
    if "connect_timeout" not in url.query:
        url = url.update_query_dict({"connect_timeout": str(topology.connect_timeout_s)})
    return get_engine(url.render_as_string(hide_password=False))


def read_each_shard(topology: Topology, read: Callable[[Connection], T]) -> tuple[dict[str, T], dict[str, str]]:
    """`read` on each shard's own database in turn: shard -> its answer, and shard -> why for those that did
    not answer. A shard found down (here or by a fleet read) is left out for fleet.RECHECK_S, untried."""
    got: dict[str, T] = {}
    down: dict[str, str] = {}
    now = time.monotonic()
    for shard in sorted(topology.shards):
        until, why = _DOWN.get(shard, (0.0, ""))
        if until > now:
            down[shard] = why
            continue
        try:
            with shard_engine(topology, shard).connect() as conn:
                got[shard] = read(conn)
        except (DBAPIError, psycopg.Error) as exc:
            from service.migrate import one_line  # alembic: not at import

            down[shard] = one_line(exc) or type(exc).__name__
            _DOWN[shard] = (time.monotonic() + RECHECK_S, down[shard])
    return got, down


def _shard_blocked(conn: Connection, name: str) -> dict[str, list[dict[str, Any]]] | None:
    """A shard's per-device blocked rules (coverage.py's, from the shard's own inventory copy), read once per
    saved state; None before its first cycle."""
    saved = conn.execute(text("SELECT saved_at FROM detector_state WHERE name = :n"), {"n": name}).scalar()
    if saved is None:
        return None
    key = (str(conn.engine.url), name)
    with _BLOCKED_LOCK:
        hit = _BLOCKED.get(key)
    if hit is not None and hit[0] == saved:
        return hit[1]
    value = _read_blocked(conn, name)
    with _BLOCKED_LOCK:
        _BLOCKED[key] = (saved, value)
    return value


def blocked_across_shards(conn: Connection, topology: Topology, name: str = "default"
                          ) -> tuple[Callable[[str], list[dict[str, Any]] | None], set[str]]:
    """`/targets`' blocked rules when sharded: each device's from its own shard's detector state (a shard's
    state also holds the far ends of its cross-shard links, which are another shard's to answer for). Returns
    device -> its rules (None: its shard has no state yet, or did not answer), and the pods of the shards
    that did not answer ('' for pod-less devices)."""
    stored = pod_map(conn)
    owner = {dev: stored.get(pod, topology.shard_of(pod or None)) for dev, pod in conn.execute(
        text("SELECT name, coalesce(pod, '') FROM devices")).all()}
    per, down = read_each_shard(topology, lambda c: _shard_blocked(c, name))

    def of(device: str) -> list[dict[str, Any]] | None:
        rules = per.get(owner.get(device, topology.default))
        return None if rules is None else rules.get(device, [])

    return of, {p for p, s in stored.items() if s in down}
