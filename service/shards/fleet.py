"""Fleet-wide reads through the control database's fleet tables (postgres_fdw foreign partitions).

A read asks the partitioned parents for `pod = ANY(<pods>)` and the time range: PostgreSQL sends these
conditions to each shard (Remote SQL) and prunes the partitions of pods not asked for, which are then never
connected to (in plans made for the pods asked, CUSTOM_PLANS: a generic plan prunes nothing). When a shard
does not answer, the query fails; the read then connects to each shard of the stored pod map, and asks
again for the pods of those that answered only. Shards found down are left out without trying for
RECHECK_S. What they hold is named (`Reach.missing`), never passed off as a whole answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import numpy as np
import psycopg
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from service.shards.setup import FLEET_SCHEMA
from service.shards.topology import NO_POD, Topology, probe
from service.telemetry import catalogue
from service.telemetry.counters import rates
from service.telemetry.readcache import Contributions, Mark, from_rows
from service.telemetry.rollups import Level
from service.telemetry.service import (
    RollupReaders,
    SeriesResult,
    _bucket_gauge,
    _bucket_rates,
    _pick_level,
    _query_rollups,
)
from service.telemetry.store import Samples, _decoded, copy_rows_and_chunks, merge

MISSING_HEADER = "X-Fabricwatch-Missing-Pods"
RECHECK_S = 5.0  # a shard found down is left out of reads this long before it is tried again
_DOWN: dict[str, tuple[float, str]] = {}  # shard -> (left out until, monotonic clock; why)
# Plans made with the pods known. A generic plan (the plan cache's choice for a statement a session runs
# often, e.g. /series' lookup after fleet-wide reads of the same text) cannot prune `pod = ANY($1)`, at
# plan time or at executor start (PostgreSQL prunes partitions by an array parameter in neither): it asked
# every shard for one device's rows (39, 90, 127 ms with 1, 2, 3 shards in docs/benchmarks.md).
CUSTOM_PLANS = "SET LOCAL plan_cache_mode = force_custom_plan"


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


def recheck_now() -> None:
    """Forget which shards were found down: the next read tries them all again."""
    _DOWN.clear()


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


def _which(found: list[Any], pod_shard: dict[str, str], mark: str = ":{}") -> tuple[str, dict[str, Any]]:
    """A condition naming exactly these (pod, series) pairs: series ids are per shard, so one (pods, ids)
    pair of arrays per shard; each shard's partition only matches its own pods. `mark` formats a bind
    parameter's name (":{}" for SQLAlchemy, "%({})s" for psycopg)."""
    groups: dict[str, tuple[set[str], set[int]]] = {}
    for r in found:
        pods, sids = groups.setdefault(pod_shard[r.pod], (set(), set()))
        pods.add(r.pod)
        sids.add(r.series_id)
    params: dict[str, Any] = {}
    terms = []
    for i, (pods, sids) in enumerate(groups.values()):
        params[f"p{i}"], params[f"s{i}"] = sorted(pods), sorted(sids)
        terms.append(f"(pod = ANY(CAST({mark.format(f'p{i}')} AS text[])) "
                     f"AND series_id = ANY(CAST({mark.format(f's{i}')} AS int[])))")
    return "(" + " OR ".join(terms) + ")", params


def rows_sql(which: str) -> str:
    return f"SELECT pod, series_id, ts, value FROM {FLEET_SCHEMA}.rows WHERE {which} AND ts >= :lo AND ts <= :hi"


def _us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _copy_sql(which: str) -> str:
    """(index, ts[], value[], chunk) rows, store.parse_copy's shape: per series its rows as arrays (aggregated
    here, after the shards sent the rows their conditions select), its blocks, and its chunks. The series'
    index comes from joining the (pod, series) pairs; `which` keeps every condition on the foreign scans."""
    k = ("JOIN unnest(CAST(%(kp)s AS text[]), CAST(%(ks)s AS int[]), CAST(%(ki)s AS int[])) AS k(kpod, ksid, idx) "
         "ON k.kpod = t.pod AND k.ksid = t.series_id")
    return (f"SELECT k.idx, t.ts, t.vals, NULL::bytea FROM (SELECT pod, series_id, array_agg(ts ORDER BY ts) ts, "
            f"array_agg(value ORDER BY ts) vals FROM {FLEET_SCHEMA}.rows WHERE {which} AND ts >= %(lo)s "
            f"AND ts <= %(hi)s GROUP BY pod, series_id) t {k} "
            f"UNION ALL SELECT k.idx, t.ts, t.vals, NULL FROM {FLEET_SCHEMA}.blocks t {k} "
            f"WHERE {which} AND t.last_ts >= %(lo)s AND t.first_ts <= %(hi)s "
            # a chunk lies in one UTC day: those with samples in [lo, hi] start on or after lo's day (store.py)
            f"UNION ALL SELECT k.idx, NULL, NULL, t.data FROM {FLEET_SCHEMA}.chunks t {k} "
            f"WHERE {which} AND t.first_ts >= %(day)s AND t.first_ts <= %(hi)s AND t.last_ts >= %(lo)s")


def _read_params(found: list[Any], pod_shard: dict[str, str], lo: datetime, hi: datetime
                 ) -> tuple[str, dict[str, Any]]:
    which, params = _which(found, pod_shard, "%({})s")
    params |= {"kp": [r.pod for r in found], "ks": [r.series_id for r in found], "ki": list(range(len(found))),
               "lo": lo, "hi": hi, "day": lo.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)}
    return _copy_sql(which), params


def explain_read(conn: Connection, found: list[Any], pod_shard: dict[str, str], lo: datetime, hi: datetime) -> str:
    """EXPLAIN VERBOSE of the read `read_fleet_samples` runs for these series (docs, tests)."""
    query, params = _read_params(found, pod_shard, lo, hi)
    with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
        cur.execute("SET LOCAL enable_partitionwise_aggregate = on")
        return "\n".join(r[0] for r in cur.execute("EXPLAIN (VERBOSE, COSTS OFF) " + query, params))


def read_fleet_samples(conn: Connection, found: list[Any], pod_shard: dict[str, str], lo: datetime,
                       hi: datetime) -> Samples:
    """Samples of these series in [lo, hi] from rows, blocks and chunks on their shards, keyed by the
    series' index in `found`, sorted by (index, time), one per (series, time). One binary COPY, parsed
    by numpy (store.parse_copy), as the single-server read does."""
    if not found:
        return Samples.empty()
    query, params = _read_params(found, pod_shard, lo, hi)
    raw = conn.connection.driver_connection
    with raw.cursor() as cur:  # type: ignore[union-attr]
        # each shard aggregates its own rows into a row of arrays per series (sent as one row, not thousands)
        cur.execute("SET LOCAL enable_partitionwise_aggregate = on")
        cur.execute(CUSTOM_PLANS)  # detection calls this outside read_fleet
        plain, chunks = copy_rows_and_chunks(cur, query, params)
    lo_us, hi_us = _us(lo), _us(hi)
    plain = plain.take(np.nonzero((plain.ts_us >= lo_us) & (plain.ts_us <= hi_us))[0])  # blocks overhang
    plain = plain.take(np.lexsort((plain.ts_us, plain.sid)))
    # a chunk's reading wins over a late row at the same time, as in store.py
    return merge(_decoded(chunks, lo, hi), plain)[0]


T = TypeVar("T")


def read_fleet(conn: Connection, topology: Topology, read: Callable[[list[str], dict[str, str]], T],
               asked: set[str] | None = None) -> tuple[T, Reach]:
    """Run `read(pods, pod_shard)` over the shards that answer, and say who was missing. Its statements
    are planned for the pods they name (CUSTOM_PLANS): only those pods' shards are asked.

    Optimistic: every shard answers but those found down in the last RECHECK_S (no connection of our own
    per read). A read that fails asks each shard, then goes again (after a rollback) without the ones down;
    a second failure is raised. `asked`: the pods the answer can hold (None: every pod); only those count
    as missing."""
    pod_shard = pod_map(conn)
    now = time.monotonic()
    recent = {s: why for s, (until, why) in _DOWN.items() if until > now and s in topology.shards}
    seen = Reach(sorted(p for p, s in pod_shard.items() if s not in recent),
                 sorted(p for p, s in pod_shard.items() if s in recent), recent)
    for attempt in (1, 2):
        try:
            conn.execute(text(CUSTOM_PLANS))
            got = read([p for p in seen.live if asked is None or p in asked], pod_shard)
            break
        except (DBAPIError, psycopg.Error):
            conn.rollback()
            if attempt == 2:
                raise
            seen = reach(conn, topology)
            _DOWN.update({s: (time.monotonic() + RECHECK_S, why) for s, why in seen.down.items()})
    if asked is not None:
        seen = Reach(seen.live, [p for p in seen.missing if p in asked], seen.down)
    return got, seen


# --- rollups -----------------------------------------------------------------------------------------

def fleet_marks(conn: Connection, pods: list[str]) -> dict[str, Mark]:
    """Each level's watermark across the shards of these pods: the earliest, since rollup rows before it
    are final on every one of them; a level that one of them lacks is absent (its rows are not read)."""
    if not pods:
        return {}
    rows = conn.execute(text(f"SELECT level, min(done_until), bool_or(done_until IS NULL) "
                             f"FROM {FLEET_SCHEMA}.rollup_marks WHERE pod = ANY(:pods) GROUP BY level"),
                        {"pods": pods}).all()
    return {level: Mark(done, ()) for level, done, lacking in rows if done is not None and not lacking}


def _keys(found: list[Any]) -> dict[str, Any]:
    return {"kp": [r.pod for r in found], "ks": [r.series_id for r in found], "ki": list(range(len(found)))}


_KEYS = ("JOIN unnest(CAST(:kp AS text[]), CAST(:ks AS int[]), CAST(:ki AS int[])) AS k(kpod, ksid, idx) "
         "ON k.kpod = t.pod AND k.ksid = t.series_id")


def rollup_sql(table: str, which: str) -> str:
    """Rollup rows of the series `which` names, in [lo, hi), as (index, bucket ms, n, avg, increase,
    covered_s) sorted by index and bucket: readcache.from_rows' shape. Every condition on `t` goes to the
    shard (asserted in tests/shards/test_fleet_reads.py)."""
    return (f"SELECT k.idx, (extract(epoch FROM t.bucket) * 1000)::bigint, t.n, t.avg, t.increase, t.covered_s "
            f"FROM {FLEET_SCHEMA}.{table} t {_KEYS} WHERE {which} AND t.bucket >= :lo AND t.bucket < :hi "
            f"ORDER BY k.idx, t.bucket")


def _readers(found: list[Any], pod_shard: dict[str, str], pods: list[str]) -> RollupReaders:
    """`_query_rollups`' readers over the fleet tables; series are keyed by their index in `found`."""
    def marks(conn: Connection) -> dict[str, Mark]:
        return fleet_marks(conn, sorted({r.pod for r in found} & set(pods)))

    def contributions(conn: Connection, level: Level, mark: Mark, idx: list[int], lo: datetime, hi: datetime,
                      is_counter: bool) -> dict[int, Contributions]:
        if lo >= hi or not idx:
            return dict.fromkeys(idx, Contributions.empty())
        some = [found[i] for i in idx]
        which, params = _which(some, pod_shard)
        rows = conn.execute(text(rollup_sql(level.table, which)),
                            params | _keys(found) | {"lo": lo, "hi": hi}).all()
        wanted = set(idx)
        return from_rows([r for r in rows if r[0] in wanted], idx, is_counter)

    def per_series(conn: Connection, idx: list[int], lo: datetime, hi: datetime
                   ) -> dict[int, tuple[list[int], list[float]]]:
        got = read_fleet_samples(conn, found, pod_shard, lo, hi)
        cuts = np.searchsorted(got.sid, idx, side="left").tolist()
        ends = np.searchsorted(got.sid, idx, side="right").tolist()
        return {i: (got.ts_ms[cuts[k]:ends[k]].tolist(), got.value[cuts[k]:ends[k]].tolist())
                for k, i in enumerate(idx)}

    return marks, contributions, per_series


def query_series(*, conn: Connection, topology: Topology, metric: str, start: datetime, end: datetime,
                 device: str | None = None, port: str | None = None, lane: int | None = None,
                 priority: int | None = None, gpu: int | None = None, step_s: float | None = None,
                 raw: bool = False, max_series: int = 1000,
                 level_after_s: tuple[float, float] | None = None) -> tuple[list[SeriesResult], Reach]:
    """`/api/v1/series` over every shard that answers, as on one server: raw samples (rows, blocks, chunks)
    for short ranges, the shards' rollups before their watermarks for long ones (`level_after_s`, default
    from settings), counters as per-second rates. Returns the series and who was missing."""
    mdef = catalogue.get(metric)
    if mdef is None:
        raise KeyError(metric)
    asked: set[str] | None = None  # one device: only its pod's shard is asked (the inventory is here)
    if device is not None:
        asked = set(conn.execute(text("SELECT coalesce(pod, '') FROM devices WHERE name = :d"),
                                 {"d": device}).scalars())
    is_counter = mdef.kind is catalogue.Kind.COUNTER and not raw
    level = None if raw else _pick_level(end - start, step_s, level_after_s)

    def read(pods: list[str], pod_shard: dict[str, str]) -> list[SeriesResult]:
        found = conn.execute(text(_FLEET_SERIES_SQL), {
            "pods": pods, "metric": metric, "device": device, "port": port, "lane": lane,
            "priority": priority, "gpu": gpu, "limit": max_series}).all() if pods else []
        if level is not None:
            keyed = [(i, *r[2:10]) for i, r in enumerate(found)]  # the index stands in for the series id
            return _query_rollups(conn, level, mdef, keyed, start, end, step_s, is_counter,
                                  readers=_readers(found, pod_shard, pods))
        got = read_fleet_samples(conn, found, pod_shard, start, end)
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
        return out

    return read_fleet(conn, topology, read, asked)


# --- the newest samples (fleet summary, topology) ----------------------------------------------------

def latest_sql(extra: str = "") -> str:
    """Each selected series' newest two samples (rn 1, 2) on the shards of `:pods`, of `:metrics`."""
    return (f"SELECT pod, series_id, port_id, rn, value FROM {FLEET_SCHEMA}.latest "
            f"WHERE pod = ANY(:pods) AND metric = ANY(:metrics) AND port_id IS NOT NULL {extra}")


__all__ = ["MISSING_HEADER", "NO_POD", "Reach", "latest_sql", "query_series", "reach", "read_fleet",
           "read_fleet_samples", "rows_sql"]
