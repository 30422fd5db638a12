"""The telemetry KPIs across shards: each shard aggregates its own samples, the control side merges.

The single-server SQL (service/kpis/service.py) runs on each shard's own database, up to aggregates that add
up across shards: per (group, bucket) the sums, maxima and counts of its ports' intervals, and per port its
worst-port rates. A port's series all lie on its device's shard, so everything per port is final there; a
group (a link, a leaf, a pod, the fabric) may span shards, so its sums are added here. Groups come from the
control database (links and the far end's device are not on the shard) and go to each shard as arrays of
its own ports only. The p95 of a group's utilization is no sum: once the counts are known, each shard sends
the top values of each (group, bucket) that the p95 can fall among (about 5 % of the intervals, at least
one), and the p95 is interpolated here as percentile_cont does. What comes back is those aggregates, never
samples. Compressed chunks of the range are decoded by this process for the shard's session as one
server's are (store.stage_chunks): their bytes come here, their samples go back to the same shard.
The shards are asked at once (a thread each); one that fails fails the read, which `read_fleet` then asks
again without the shards found down, and names their pods.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, text

from service.kpis.service import (
    AVAIL_CTE,
    AVAIL_METRICS,
    AVAIL_SUMS,
    CONGESTION_CTE,
    CONGESTION_RATES,
    KPI_METRICS,
    MERGED_SOURCE,
    RANGE_HI,
    RANGE_LO,
    RAW,
    UTIL_CTE,
    UTIL_METRICS,
    WORST_CTE,
    KpiPoint,
    KpiReport,
    RankedPort,
    Scope,
    base_sql,
    congestion_point,
    group_labels,
    members,
    sql_params,
)
from service.shards.topology import Topology
from service.telemetry.store import merged_between, stage_chunks

UTIL_TABLE = "kpi_util"  # the shard session's per-interval utilization, for the p95's second question
P95 = 0.95

# --- what each shard runs --------------------------------------------------------------------------------

UTIL_PARTS_SQL = f"SELECT grp, bucket, sum(bits) AS bits, sum(cap) AS cap, max(util) AS peak, count(*) AS n " \
                 f"FROM {UTIL_TABLE} GROUP BY grp, bucket"
# per (group, bucket) the `t` largest values of this shard (t from the counts of every shard)
UTIL_TOP_SQL = f"""
SELECT x.grp, x.bucket, x.util FROM (
  SELECT grp, bucket, util, row_number() OVER (PARTITION BY grp, bucket ORDER BY util DESC) AS rn FROM {UTIL_TABLE}
) x JOIN unnest(CAST(:g AS text[]), CAST(:b AS timestamptz[]), CAST(:t AS int[])) AS w(grp, bucket, t)
  ON w.grp = x.grp AND w.bucket = x.bucket
WHERE x.rn <= w.t"""


def util_sql() -> str:
    """The shard's per-interval utilization into its session's UTIL_TABLE (then summed, and asked for the
    p95's top values)."""
    return (f"INSERT INTO {UTIL_TABLE} (grp, bucket, bits, cap, util) "
            + base_sql(UTIL_METRICS, Scope.FABRIC, RAW, on_shard=True) + UTIL_CTE
            + "\nSELECT grp, bucket, bits, cap, util FROM u")


def congestion_sql() -> str:
    return (base_sql(list(CONGESTION_RATES), Scope.FABRIC, RAW, on_shard=True) + CONGESTION_CTE
            + "\nSELECT grp, bucket, metric, sum(d) AS d, sum(dt) AS dt FROM per_port GROUP BY grp, bucket, metric")


def availability_sql() -> str:
    return (base_sql(AVAIL_METRICS, Scope.FABRIC, RAW, on_shard=True) + AVAIL_CTE
            + f"\nSELECT grp, bucket, {AVAIL_SUMS} FROM x GROUP BY grp, bucket")


def worst_sql() -> str:
    """Per metric the shard's `top` worst ports: the fleet's `top` are among the shards' (a port is on one)."""
    return (base_sql(list(CONGESTION_RATES), Scope.FABRIC, RAW, on_shard=True) + WORST_CTE
            + "\nSELECT metric, port_id, rate FROM ranked WHERE rn <= :top")


def _staged(sql: str, staged: int) -> str:
    """As service._stage: rows and blocks alone when no chunk of the range was decoded."""
    return sql if staged else sql.replace(MERGED_SOURCE, merged_between(RANGE_LO, RANGE_HI, staged))


@dataclass
class ShardParts:
    """One shard's partial aggregates."""

    util: list[Any] = field(default_factory=list)          # grp, bucket, bits, cap, peak, n
    congestion: list[Any] = field(default_factory=list)    # grp, bucket, metric, d, dt
    availability: list[Any] = field(default_factory=list)  # grp, bucket, up_s, seen_s, flaps
    worst: list[Any] = field(default_factory=list)         # metric, port_id, rate


def shard_params(pods: list[str], ports: list[Any], start: datetime, end: datetime, step_s: float,
                 max_gap_s: float) -> dict[str, Any]:
    """The bind parameters of the shard SQL: its pods, its ports' groups (`members` rows), the range."""
    return sql_params(start, end, step_s, max_gap_s) | {
        "pods": pods, "m_port": [m.port_id for m in ports], "m_grp": [m.grp for m in ports],
        "m_speed": [None if m.speed_bps is None else float(m.speed_bps) for m in ports]}


def shard_parts(conn: Connection, params: dict[str, Any], top: int) -> ShardParts:
    """Run on one shard, in one transaction that stays open for `shard_top` (its UTIL_TABLE)."""
    sids = conn.execute(text("SELECT s.id FROM series s JOIN devices d ON d.id = s.device_id "
                             "WHERE s.metric = ANY(:m) AND s.port_id IS NOT NULL "
                             "AND coalesce(d.pod, '') = ANY(CAST(:pods AS text[]))"),
                        {"m": KPI_METRICS, "pods": params["pods"]}).scalars().all()
    # the chunks of the range, for every KPI metric at once (one server decodes them per KPI)
    staged = stage_chunks(conn, params["start"] - timedelta(seconds=params["max_gap"]), params["end"], list(sids))
    conn.execute(text(f"CREATE TEMP TABLE IF NOT EXISTS {UTIL_TABLE} (grp text NOT NULL, bucket timestamptz "
                      f"NOT NULL, bits float8, cap float8, util float8) ON COMMIT DELETE ROWS"))
    conn.execute(text(f"DELETE FROM {UTIL_TABLE}"))
    conn.execute(text(_staged(util_sql(), staged)), params)
    span = max((params["end"] - params["start"]).total_seconds(), 1.0)
    return ShardParts(
        util=conn.execute(text(UTIL_PARTS_SQL)).all(),
        congestion=conn.execute(text(_staged(congestion_sql(), staged)), params).all(),
        availability=conn.execute(text(_staged(availability_sql(), staged)), params).all(),
        worst=conn.execute(text(_staged(worst_sql(), staged)), params | {"step": span, "top": top}).all())


def shard_top(conn: Connection, wanted: dict[tuple[str, datetime], int]) -> list[Any]:
    """(grp, bucket, util): this shard's `t` largest utilization values of each wanted (group, bucket)."""
    if not wanted:
        return []
    keys = sorted(wanted)
    return conn.execute(text(UTIL_TOP_SQL), {"g": [k[0] for k in keys], "b": [k[1] for k in keys],
                                             "t": [wanted[k] for k in keys]}).all()


# --- the merge ---------------------------------------------------------------------------------------------

def _add(a: float | None, b: float | None) -> float | None:
    """SQL's sum across parts: NULL only when every part is."""
    return b if a is None else a if b is None else a + b


def p95_rank(n: int) -> tuple[float, int]:
    """percentile_cont(0.95) over n values: its position in the ascending order, and how many of the
    largest values it needs (down to the position's floor)."""
    pos = P95 * (n - 1)
    return pos, n - math.floor(pos)


def p95_of(largest: list[float], n: int) -> float:
    """percentile_cont(0.95) of n values, from their largest ones (any order, at least p95_rank's count)."""
    pos, need = p95_rank(n)
    top = sorted(largest, reverse=True)[:need]
    lo, hi = math.floor(pos), math.ceil(pos)
    first, second = top[n - 1 - lo], top[n - 1 - hi]
    return first + (pos - lo) * (second - first)


def merge(parts: list[ShardParts], tops: list[list[Any]], labels: dict[str, str], worst_names: list[Any],
          top: int) -> tuple[list[KpiPoint], list[KpiPoint], list[KpiPoint], dict[str, list[RankedPort]]]:
    """The shards' partial aggregates as one server's utilization, congestion, availability, worst ports."""
    util: dict[tuple[str, datetime], list[Any]] = {}
    for p in parts:
        for r in p.util:
            cur = util.setdefault((r.grp, r.bucket), [0.0, 0.0, None, 0])
            cur[0] += r.bits
            cur[1] += r.cap
            cur[2] = r.peak if cur[2] is None else max(cur[2], r.peak)
            cur[3] += r.n
    largest: dict[tuple[str, datetime], list[float]] = defaultdict(list)
    for rows in tops:
        for r in rows:
            largest[(r.grp, r.bucket)].append(r.util)
    utilization = [KpiPoint(g, b, {"utilization_mean": bits / cap, "utilization_peak": peak,
                                   "utilization_p95": p95_of(largest[(g, b)], n), "intervals": n})
                   for (g, b), (bits, cap, peak, n) in sorted(util.items())]

    cong: dict[tuple[str, datetime], dict[str, list[float | None]]] = {}
    for p in parts:
        for r in p.congestion:
            sums = cong.setdefault((r.grp, r.bucket), {}).setdefault(r.metric, [None, None])
            sums[0], sums[1] = _add(sums[0], r.d), _add(sums[1], r.dt)
    congestion = [KpiPoint(g, b, congestion_point({m: d / dt if d is not None and dt else None
                                                   for m, (d, dt) in v.items()}))
                  for (g, b), v in sorted(cong.items())]

    avail: dict[tuple[str, datetime], list[float | None]] = {}
    for p in parts:
        for r in p.availability:
            cur = avail.setdefault((r.grp, r.bucket), [None, None, None])
            cur[:] = [_add(cur[0], r.up_s), _add(cur[1], r.seen_s), _add(cur[2], r.flaps)]
    availability = [KpiPoint(g, b, {"availability": up / seen if up is not None and seen else None,
                                    "flaps": flaps}) for (g, b), (up, seen, flaps) in sorted(avail.items())]

    by_port: dict[int, list[Any]] = defaultdict(list)
    for m in worst_names:
        by_port[m.port_id].append(m)
    ranked: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for p in parts:
        for r in p.worst:
            ranked[r.metric].append((r.rate, r.port_id))
    worst: dict[str, list[RankedPort]] = {v: [] for v in CONGESTION_RATES.values()}
    for metric, rows in ranked.items():
        for rate, port_id in sorted(rows, key=lambda x: (-x[0], x[1]))[:top]:
            name = CONGESTION_RATES[metric]
            worst[name] += [RankedPort(m.device, m.port, m.grp or "", rate) for m in by_port[port_id]]
    return utilization, congestion, availability, worst


# --- across the shards -------------------------------------------------------------------------------------

T = TypeVar("T")
K = TypeVar("K")


def _at_once(items: dict[K, Any], fn: Callable[[Any], T]) -> dict[K, T]:
    """fn on each item, one thread each; the first failure is raised once all are done."""
    if len(items) <= 1:
        return {k: fn(v) for k, v in items.items()}
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = {k: pool.submit(fn, v) for k, v in items.items()}
        return {k: f.result() for k, f in futures.items()}


@contextmanager
def _shard_connections(topology: Topology, shards: list[str]) -> Iterator[dict[str, Connection]]:
    from service.shards.views import shard_engine  # views import the fleet reads, which import telemetry

    with ExitStack() as stack:
        yield {s: stack.enter_context(shard_engine(topology, s).connect()) for s in shards}


def fabric_kpis_across_shards(*, conn: Connection, topology: Topology, scope: Scope, start: datetime,
                              end: datetime, step_s: float, top: int, max_gap_s: float) -> KpiReport:
    """`fabric_kpis` when sharded: the partial aggregates of the shards that answer, merged; the pods of the
    others named in `missing_pods`."""
    from service.shards.fleet import read_fleet

    all_members = members(conn, scope)
    labels = group_labels(conn=conn, scope=scope)

    def read(pods: list[str], pod_shard: dict[str, str]) -> KpiReport:
        per_shard: dict[str, list[str]] = defaultdict(list)
        for pod in pods:
            per_shard[pod_shard[pod]].append(pod)
        with _shard_connections(topology, sorted(per_shard)) as conns:
            params = {s: shard_params(ps, [m for m in all_members if m.pod in ps], start, end, step_s, max_gap_s)
                      for s, ps in per_shard.items()}
            parts = _at_once({s: (conns[s], params[s]) for s in conns},
                             lambda a: shard_parts(a[0], a[1], top))
            counts: dict[tuple[str, datetime], int] = defaultdict(int)
            for p in parts.values():
                for r in p.util:
                    counts[(r.grp, r.bucket)] += r.n
            need = {k: p95_rank(n)[1] for k, n in counts.items()}
            # a shard is asked only for its own (group, bucket)s
            wanted = {s: {(r.grp, r.bucket): need[(r.grp, r.bucket)] for r in p.util} for s, p in parts.items()}
            tops = _at_once({s: (conns[s], wanted[s]) for s in conns}, lambda a: shard_top(a[0], a[1]))
        utilization, congestion, availability, worst = merge(list(parts.values()), list(tops.values()), labels,
                                                             all_members, top)
        return KpiReport(scope=scope.value, start=start, end=end, step_s=step_s, source=RAW.name, labels=labels,
                         utilization=utilization, congestion=congestion, availability=availability,
                         worst_ports=worst)

    rep, seen = read_fleet(conn, topology, read)
    rep.missing_pods = seen.missing_shown
    return rep
