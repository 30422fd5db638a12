"""Fleet-wide reads through the control database's fleet tables (postgres_fdw foreign partitions).

A read first asks each shard of the stored pod map whether it answers (`live`), then queries the
partitioned parents with `pod = ANY(<the live shards' pods>)`: PostgreSQL prunes the down shards' partitions,
so they are never connected to, and sends the pod and time conditions to the others (Remote SQL). What the
down shards hold is named in `missing_pods`, never passed off as a whole answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from service.shards.setup import FLEET_SCHEMA
from service.shards.topology import NO_POD, Topology, probe
from service.telemetry import catalogue
from service.telemetry.chunk_codec import decode
from service.telemetry.counters import rates
from service.telemetry.service import SeriesResult, _bucket_gauge, _bucket_rates
from service.telemetry.store import Samples, merge

MISSING_HEADER = "X-Fabricwatch-Missing-Pods"


@dataclass(frozen=True)
class Reach:
    """Which pods a fleet read can see now."""

    live: list[str]  # pods of the shards that answered ('' for pod-less devices)
    missing: list[str]  # pods of the shards that did not
    down: dict[str, str] = field(default_factory=dict)  # shard -> why

    @property
    def missing_shown(self) -> list[str]:
        """Missing pods as the API names them: '' is '(no pod)'."""
        return [p or "(no pod)" for p in self.missing]


def pod_map(conn: Connection) -> dict[str, str]:
    return dict(conn.execute(text("SELECT pod, shard FROM shard_pods")).all())


def reach(conn: Connection, topology: Topology) -> Reach:
    pods = pod_map(conn)
    down = {s: why for s, why in probe(topology, sorted(set(pods.values()) & set(topology.shards))).items()
            if why is not None}
    return Reach(sorted(p for p, s in pods.items() if s not in down),
                 sorted(p for p, s in pods.items() if s in down), down)


_FLEET_SERIES_SQL = f"""
SELECT pod, series_id, metric, device, port, lane, priority, gpu, counter_bits, saturating
FROM {FLEET_SCHEMA}.series
WHERE pod = ANY(:pods) AND metric = :metric
  AND (CAST(:device AS text) IS NULL OR device = :device)
  AND (CAST(:port AS text) IS NULL OR port = :port)
  AND (CAST(:lane AS int) IS NULL OR lane = :lane)
  AND (CAST(:priority AS int) IS NULL OR priority = :priority)
  AND (CAST(:gpu AS int) IS NULL OR gpu = :gpu)
ORDER BY device, port NULLS FIRST, lane NULLS FIRST, priority NULLS FIRST, gpu NULLS FIRST
LIMIT :limit
"""


def _which(found: list[Any], pod_shard: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """A condition naming exactly these (pod, series) pairs: series ids are per shard, so one (pods, ids)
    pair of arrays per shard; each shard's partition only matches its own pods."""
    groups: dict[str, tuple[set[str], set[int]]] = {}
    for r in found:
        pods, sids = groups.setdefault(pod_shard[r.pod], (set(), set()))
        pods.add(r.pod)
        sids.add(r.series_id)
    params: dict[str, Any] = {}
    terms = []
    for i, (pods, sids) in enumerate(groups.values()):
        params[f"p{i}"], params[f"s{i}"] = sorted(pods), sorted(sids)
        terms.append(f"(pod = ANY(CAST(:p{i} AS text[])) AND series_id = ANY(CAST(:s{i} AS int[])))")
    return "(" + " OR ".join(terms) + ")", params


def rows_sql(which: str) -> str:
    return f"SELECT pod, series_id, ts, value FROM {FLEET_SCHEMA}.rows WHERE {which} AND ts >= :lo AND ts <= :hi"


def _us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def read_fleet_samples(conn: Connection, found: list[Any], pod_shard: dict[str, str], lo: datetime,
                       hi: datetime) -> Samples:
    """Samples of these series in [lo, hi] from rows, blocks and chunks on their shards, keyed by the
    series' index in `found`, sorted by (index, time), one per (series, time)."""
    if not found:
        return Samples.empty()
    index = {(r.pod, r.series_id): i for i, r in enumerate(found)}
    which, params = _which(found, pod_shard)
    params |= {"lo": lo, "hi": hi, "day": lo.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)}
    sid: list[int] = []
    ts: list[int] = []
    val: list[float] = []
    for pod, series_id, t, v in conn.execute(text(rows_sql(which)), params):
        sid.append(index[(pod, series_id)])
        ts.append(_us(t))
        val.append(v)
    blocks = conn.execute(text(f"SELECT pod, series_id, ts, vals FROM {FLEET_SCHEMA}.blocks WHERE {which} "
                               f"AND last_ts >= :lo AND first_ts <= :hi"), params)
    lo_us, hi_us = _us(lo), _us(hi)
    for pod, series_id, times, vals in blocks:
        for t, v in zip(times, vals, strict=True):
            if lo_us <= (u := _us(t)) <= hi_us:
                sid.append(index[(pod, series_id)])
                ts.append(u)
                val.append(v)
    plain = Samples(np.array(sid, np.int64), np.array(ts, np.int64), np.array(val, np.float64))
    # A chunk lies in one UTC day: those with samples in [lo, hi] start on or after lo's day (as store.py).
    chunks = conn.execute(text(f"SELECT pod, series_id, data FROM {FLEET_SCHEMA}.chunks WHERE {which} "
                               f"AND first_ts >= :day AND first_ts <= :hi AND last_ts >= :lo"), params)
    parts = [Samples.empty()]
    for pod, series_id, data in chunks:
        c_ts, c_val = decode(data)
        keep = (c_ts >= lo_us) & (c_ts <= hi_us)
        parts.append(Samples(np.full(int(keep.sum()), index[(pod, series_id)], np.int64), c_ts[keep], c_val[keep]))
    packed = Samples(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("sid", "ts_us", "value")))
    return merge(packed, plain)[0]  # a chunk's reading wins over a late row at the same time, as store.py


def query_series(*, conn: Connection, topology: Topology, metric: str, start: datetime, end: datetime,
                 device: str | None = None, port: str | None = None, lane: int | None = None,
                 priority: int | None = None, gpu: int | None = None, step_s: float | None = None,
                 raw: bool = False, max_series: int = 1000) -> tuple[list[SeriesResult], Reach]:
    """`/api/v1/series` over every shard that answers: raw samples (rows, blocks, chunks; rollups are not
    read across shards yet), counters as per-second rates. Returns the series and who was missing."""
    mdef = catalogue.get(metric)
    if mdef is None:
        raise KeyError(metric)
    for attempt in (1, 2):
        seen = reach(conn, topology)
        pod_shard = pod_map(conn)
        try:
            found = conn.execute(text(_FLEET_SERIES_SQL), {
                "pods": seen.live, "metric": metric, "device": device, "port": port, "lane": lane,
                "priority": priority, "gpu": gpu, "limit": max_series}).all() if seen.live else []
            got = read_fleet_samples(conn, found, pod_shard, start, end)
            break
        except DBAPIError:
            # A shard went away between the probe and the query: ask again, and leave it out this time.
            conn.rollback()
            if attempt == 2:
                raise
    is_counter = mdef.kind is catalogue.Kind.COUNTER and not raw
    cuts = np.searchsorted(got.sid, np.arange(len(found)), side="left").tolist()
    ends = np.searchsorted(got.sid, np.arange(len(found)), side="right").tolist()
    out = []
    for i, r in enumerate(found):
        ts = got.ts_ms[cuts[i]:ends[i]].tolist()
        vals = got.value[cuts[i]:ends[i]].tolist()
        if is_counter:
            per_s = rates(ts, vals, bits=r.counter_bits, saturating=r.saturating)
            points = _bucket_rates(ts, per_s, step_s) if step_s else list(zip(ts[1:], per_s[1:], strict=True))
        else:
            points = list(zip(ts, vals, strict=True))
            if step_s:
                points = _bucket_gauge(points, step_s)
        out.append(SeriesResult(r.metric, r.device, r.port, r.lane, r.priority, r.gpu, mdef.kind.value,
                                "1/s" if is_counter else mdef.unit, points))
    return out, seen


__all__ = ["MISSING_HEADER", "NO_POD", "Reach", "query_series", "reach", "read_fleet_samples", "rows_sql"]
