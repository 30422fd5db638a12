"""Fabric health KPIs from stored telemetry, and fault recovery times from incidents.

Telemetry KPIs are aggregated inside PostgreSQL: one query per KPI family turns counter samples
into per-interval increases (window `lag`, the same reset/wrap/saturation rules as
service.telemetry.counters), maps each port to its group (link, leaf, rail, pod, fabric) and
returns one row per (group, step bucket). Only aggregates cross the wire.

Interval sources are swappable: `RAW` reads `samples`; a rollup table exposing the same columns
(series_id, ts, dt, d: the interval's end, length in seconds and counter increase) can be
registered with `register_source` and is then used for steps at or above its resolution.

Across shards (service/kpis/sharded.py) the same SQL runs on each shard up to decomposable partial
aggregates per (group, bucket), which are merged on the control side.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, text

from service.shards.topology import Topology
from service.telemetry.store import merged_between, stage_chunks


class Scope(StrEnum):
    LINK = "link"
    LEAF = "leaf"
    RAIL = "rail"
    POD = "pod"
    FABRIC = "fabric"


# Group key and label per scope, over the port (p, d) and its link peer (pp, pd). Every link
# direction is one port's tx, so a group sums both directions of the links it holds.
_GROUP_SQL: dict[Scope, str] = {
    Scope.LINK: "COALESCE('link:' || l.id::text, d.name || ':' || p.name)",
    Scope.LEAF: "CASE WHEN d.role = 'leaf' THEN d.name WHEN pd.role = 'leaf' THEN pd.name END",
    Scope.RAIL: "COALESCE(p.rail, pp.rail)::text",
    Scope.POD: "COALESCE(d.pod, pd.pod)",
    Scope.FABRIC: "'fabric'",
}

_MEMBERS_SQL = """
SELECT p.id AS port_id, ({group}) AS grp, d.name AS device, p.name AS port,
       p.speed_gbps * 1e9 AS speed_bps,
       CASE WHEN l.id IS NULL THEN NULL ELSE
         CASE WHEN l.a_port_id = p.id THEN d.name || ':' || p.name || ' <-> ' || pd.name || ':' || pp.name
              ELSE pd.name || ':' || pp.name || ' <-> ' || d.name || ':' || p.name END END AS link_label
FROM ports p JOIN devices d ON d.id = p.device_id
LEFT JOIN links l ON l.a_port_id = p.id OR l.b_port_id = p.id
LEFT JOIN ports pp ON pp.id = CASE WHEN l.a_port_id = p.id THEN l.b_port_id ELSE l.a_port_id END
LEFT JOIN devices pd ON pd.id = pp.device_id
"""

# Per-interval counter increases from raw samples. The sample before `start` (within max_gap) is
# read so the first interval in range is complete. NaN on either end gives no increase.
# Rows and blocks, and the compressed chunks `_stage` decoded for the range (service/telemetry/store.py).
RANGE_LO, RANGE_HI = "CAST(:start AS timestamptz) - make_interval(secs => :max_gap)", "CAST(:end AS timestamptz)"
MERGED_SOURCE = merged_between(RANGE_LO, RANGE_HI)
# On a shard (service/kpis/sharded.py): the control database's groups of the shard's ports come as arrays
# (the shard holds no links, nor the far ends' devices), and only series of the pods it owns are read.
_SHARD_MEMBERS = ("SELECT * FROM unnest(CAST(:m_port AS int[]), CAST(:m_grp AS text[]), "
                  "CAST(:m_speed AS float8[])) AS m(port_id, grp, speed_bps)")
_SHARD_SERIES = "AND s.device_id IN (SELECT id FROM devices WHERE coalesce(pod, '') = ANY(CAST(:pods AS text[])))"
_RAW_SOURCE = f"""
SELECT series_id, ts, dt,
       CASE WHEN v = 'NaN' OR pv = 'NaN' THEN NULL
            WHEN sat AND bits IS NOT NULL AND v >= power(2::float8, bits) - 1 THEN NULL
            WHEN v >= pv THEN v - pv
            WHEN bits IS NOT NULL AND NOT sat
                 AND power(2::float8, bits) - pv + v >= 0
                 AND power(2::float8, bits) - pv + v < power(2::float8, bits - 1)
                 THEN power(2::float8, bits) - pv + v
            ELSE v END AS d,
       v, pv
FROM (
  SELECT x.series_id, x.ts, x.value AS v, s.counter_bits AS bits, s.saturating AS sat,
         lag(x.value) OVER w AS pv, extract(epoch FROM x.ts - lag(x.ts) OVER w)::float8 AS dt
  FROM {MERGED_SOURCE} x
  JOIN sel s ON s.id = x.series_id
  WHERE x.ts > CAST(:start AS timestamptz) - make_interval(secs => :max_gap)
  WINDOW w AS (PARTITION BY x.series_id ORDER BY x.ts)
) q
WHERE ts > :start AND dt > 0 AND dt <= :max_gap
"""


@dataclass(frozen=True)
class IntervalSource:
    """Where per-interval increases come from: raw samples, or a rollup with the same columns."""

    name: str
    sql: str                   # selects series_id, ts, dt, d, v, pv from the series in CTE `sel`
    resolution_s: float = 0.0  # the smallest step it serves


RAW = IntervalSource("samples", _RAW_SOURCE)
_SOURCES: list[IntervalSource] = [RAW]


def register_source(source: IntervalSource) -> None:
    """Add a rollup source; the coarsest one whose resolution fits the step is used."""
    _SOURCES.append(source)
    _SOURCES.sort(key=lambda s: s.resolution_s)


def pick_source(step_s: float) -> IntervalSource:
    fitting = [s for s in _SOURCES if s.resolution_s <= step_s and step_s % max(s.resolution_s, 1) == 0]
    return fitting[-1] if fitting else RAW


def base_sql(metrics: Sequence[str], scope: Scope, source: IntervalSource, on_shard: bool = False) -> str:
    members = _SHARD_MEMBERS if on_shard else _MEMBERS_SQL.format(group=_GROUP_SQL[scope])
    return f"""
WITH members AS ({members}),
sel AS (SELECT s.id, s.metric, s.port_id, s.counter_bits, s.saturating FROM series s
        WHERE s.metric IN ({', '.join(f"'{m}'" for m in metrics)}) AND s.port_id IS NOT NULL
        {_SHARD_SERIES if on_shard else ''}),
iv AS (SELECT i.*, sel.port_id, sel.metric,
              to_timestamp(floor(extract(epoch FROM i.ts - make_interval(secs => 0.001)) / :step) * :step) AS bucket
       FROM ({source.sql}) i JOIN sel ON sel.id = i.series_id)
"""


@dataclass
class KpiPoint:
    group: str
    bucket: datetime
    values: dict[str, float | None]


@dataclass
class RankedPort:
    device: str
    port: str
    group: str
    value: float


@dataclass
class KpiReport:
    scope: str
    start: datetime
    end: datetime
    step_s: float
    source: str
    labels: dict[str, str]
    utilization: list[KpiPoint] = field(default_factory=list)
    congestion: list[KpiPoint] = field(default_factory=list)
    availability: list[KpiPoint] = field(default_factory=list)
    worst_ports: dict[str, list[RankedPort]] = field(default_factory=dict)
    missing_pods: list[str] = field(default_factory=list)  # across shards: pods of shards that did not answer


def _stage(conn: Connection, sql: str, metrics: Sequence[str], source: IntervalSource, start: datetime,
           end: datetime, max_gap_s: float) -> str:
    """Raw intervals come from compressed chunks too: decode those of these metrics' port series in range;
    `sql` reading rows and blocks alone when there were none."""
    if source is not RAW:
        return sql
    sids = conn.execute(text("SELECT id FROM series WHERE metric = ANY(:m) AND port_id IS NOT NULL"),
                        {"m": list(metrics)}).scalars().all()
    staged = stage_chunks(conn, start - timedelta(seconds=max_gap_s), end, list(sids))
    return sql if staged else sql.replace(MERGED_SOURCE, merged_between(RANGE_LO, RANGE_HI, staged))


def sql_params(start: datetime, end: datetime, step_s: float, max_gap_s: float) -> dict[str, Any]:
    return {"start": start, "end": end, "step": float(step_s), "max_gap": float(max_gap_s)}


# Each KPI's SQL after `base_sql`: its own CTEs (shared with the shards' partial aggregates, sharded.py), then
# the final SELECT of one server.
UTIL_METRICS = ["port_tx_bytes_total"]
UTIL_CTE = """
, u AS (SELECT m.grp, iv.bucket, iv.d * 8 AS bits, iv.dt * m.speed_bps AS cap, iv.d * 8 / (iv.dt * m.speed_bps) AS util
        FROM iv JOIN members m ON m.port_id = iv.port_id
        WHERE iv.d IS NOT NULL AND m.speed_bps > 0 AND m.grp IS NOT NULL)"""


def utilization(*, conn: Connection, scope: Scope, start: datetime, end: datetime, step_s: float,
                max_gap_s: float = 900.0) -> list[KpiPoint]:
    """Per group and bucket: mean (bytes*8 over capacity*time), peak and p95 of per-interval port utilization."""
    src = pick_source(step_s)
    sql = base_sql(UTIL_METRICS, scope, src) + UTIL_CTE + """
SELECT grp, bucket, sum(bits) / sum(cap) AS mean, max(util) AS peak,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY util) AS p95, count(*) AS intervals
FROM u GROUP BY grp, bucket ORDER BY grp, bucket"""
    sql = _stage(conn, sql, UTIL_METRICS, src, start, end, max_gap_s)
    rows = conn.execute(text(sql), sql_params(start, end, step_s, max_gap_s)).all()
    return [KpiPoint(r.grp, r.bucket, {"utilization_mean": r.mean, "utilization_peak": r.peak,
                                       "utilization_p95": r.p95, "intervals": r.intervals}) for r in rows]


CONGESTION_RATES = {
    "port_pfc_rx_pause_frames_total": "pfc_rx_pause_frames_per_s",
    "port_pfc_tx_pause_frames_total": "pfc_tx_pause_frames_per_s",
    "port_pfc_rx_pause_seconds_total": "pfc_rx_pause_duty",
    "port_pfc_tx_pause_seconds_total": "pfc_tx_pause_duty",
    "port_ecn_marked_packets_total": "ecn_marked_per_s",
    "port_cnp_sent_total": "cnp_sent_per_s",
}
CONGESTION_CTE = """
, per_port AS (  -- one row per port interval: priorities summed, time counted once
  SELECT m.grp, iv.bucket, iv.metric AS metric, iv.port_id, iv.ts, max(iv.dt) AS dt, sum(iv.d) AS d
  FROM iv JOIN members m ON m.port_id = iv.port_id
  WHERE iv.d IS NOT NULL AND m.grp IS NOT NULL
  GROUP BY m.grp, iv.bucket, 3, iv.port_id, iv.ts)"""


def congestion_point(rates: dict[str, float | None]) -> dict[str, float | None]:
    """A bucket's congestion values by KPI name, from metric -> rate (None: no interval of it)."""
    return {v: rates.get(m) for m, v in CONGESTION_RATES.items()}


def congestion(*, conn: Connection, scope: Scope, start: datetime, end: datetime, step_s: float,
               max_gap_s: float = 900.0) -> list[KpiPoint]:
    """Per group and bucket: PFC pause frame rates, pause duty (paused seconds / port-seconds), ECN and CNP rates.

    Rates are per port (the group's summed increase over its port-seconds); priorities of one port add up.
    """
    src = pick_source(step_s)
    sql = base_sql(list(CONGESTION_RATES), scope, src) + CONGESTION_CTE + """
SELECT grp, bucket, metric, sum(d) / sum(dt) AS rate FROM per_port GROUP BY grp, bucket, metric
ORDER BY grp, bucket"""
    out: dict[tuple[str, datetime], dict[str, float | None]] = {}
    sql = _stage(conn, sql, list(CONGESTION_RATES), src, start, end, max_gap_s)
    for r in conn.execute(text(sql), sql_params(start, end, step_s, max_gap_s)):
        out.setdefault((r.grp, r.bucket), {})[r.metric] = r.rate
    return [KpiPoint(g, b, congestion_point(v)) for (g, b), v in sorted(out.items())]


WORST_CTE = """
, per_port AS (
  SELECT iv.metric AS metric, iv.port_id, iv.ts, max(iv.dt) AS dt, sum(iv.d) AS d
  FROM iv WHERE iv.d IS NOT NULL GROUP BY 1, iv.port_id, iv.ts),
agg AS (SELECT metric, port_id, sum(d) / sum(dt) AS rate FROM per_port GROUP BY metric, port_id),
ranked AS (SELECT a.*, row_number() OVER (PARTITION BY metric ORDER BY rate DESC, port_id) AS rn
           FROM agg a WHERE rate > 0)"""


def worst_ports(*, conn: Connection, scope: Scope, start: datetime, end: datetime, top: int = 10,
                max_gap_s: float = 900.0) -> dict[str, list[RankedPort]]:
    """The ports with the highest pause duty, pause rate, ECN and CNP rate over the whole range."""
    step = max((end - start).total_seconds(), 1.0)
    sql = base_sql(list(CONGESTION_RATES), scope, RAW) + WORST_CTE + """
SELECT r.metric, r.rate, m.device, m.port, m.grp FROM ranked r JOIN members m ON m.port_id = r.port_id
WHERE rn <= :top ORDER BY r.metric, rn"""
    params = sql_params(start, end, step, max_gap_s) | {"top": top}
    out: dict[str, list[RankedPort]] = {v: [] for v in CONGESTION_RATES.values()}
    sql = _stage(conn, sql, list(CONGESTION_RATES), RAW, start, end, max_gap_s)
    for r in conn.execute(text(sql), params):
        out[CONGESTION_RATES[r.metric]].append(RankedPort(r.device, r.port, r.grp or "", r.rate))
    return out


AVAIL_METRICS = ["port_oper_up", "port_link_down_events_total"]
AVAIL_CTE = """
, x AS (SELECT m.grp, iv.bucket, iv.metric AS metric, iv.dt, iv.d, iv.v
        FROM iv JOIN members m ON m.port_id = iv.port_id WHERE m.grp IS NOT NULL)"""
# the port-time observed up, observed at all, and the link-down increases (summed across shards as well)
AVAIL_SUMS = """
       sum(CASE WHEN v > 0.5 THEN dt ELSE 0 END) FILTER (WHERE metric = 'port_oper_up' AND v <> 'NaN') AS up_s,
       sum(dt) FILTER (WHERE metric = 'port_oper_up' AND v <> 'NaN') AS seen_s,
       sum(d) FILTER (WHERE metric = 'port_link_down_events_total') AS flaps"""


def availability(*, conn: Connection, scope: Scope, start: datetime, end: datetime, step_s: float,
                 max_gap_s: float = 900.0) -> list[KpiPoint]:
    """Per group and bucket: fraction of observed port-time oper up, and link flaps (link-down increases).

    An interval (previous sample, sample] counts as up when the sample at its end reads up.
    """
    src = pick_source(step_s)
    sql = base_sql(AVAIL_METRICS, scope, src) + AVAIL_CTE + f"""
SELECT grp, bucket, up_s / NULLIF(seen_s, 0) AS up, flaps
FROM (SELECT grp, bucket, {AVAIL_SUMS} FROM x GROUP BY grp, bucket) a ORDER BY grp, bucket"""
    sql = _stage(conn, sql, AVAIL_METRICS, src, start, end, max_gap_s)
    rows = conn.execute(text(sql), sql_params(start, end, step_s, max_gap_s)).all()
    return [KpiPoint(r.grp, r.bucket, {"availability": r.up, "flaps": r.flaps}) for r in rows]


def group_labels(*, conn: Connection, scope: Scope) -> dict[str, str]:
    """Readable names of the groups (links as 'a:port <-> b:port')."""
    if scope is not Scope.LINK:
        return {}
    sql = f"SELECT DISTINCT grp, link_label FROM ({_MEMBERS_SQL.format(group=_GROUP_SQL[scope])}) m"
    return {r.grp: r.link_label or r.grp for r in conn.execute(text(sql))}


def members(conn: Connection, scope: Scope) -> list[Any]:
    """Every port's group (one row per port and link it is on): port_id, grp, device, port, speed_bps, and
    pod (its device's, '' for none): what the shards are sent, and what names their worst ports."""
    return conn.execute(text(f"SELECT m.*, coalesce(d.pod, '') AS pod FROM "
                             f"({_MEMBERS_SQL.format(group=_GROUP_SQL[scope])}) m "
                             f"JOIN ports p ON p.id = m.port_id JOIN devices d ON d.id = p.device_id "
                             f"ORDER BY m.port_id")).all()


def fabric_kpis(*, conn: Connection, scope: Scope, start: datetime, end: datetime, step_s: float,
                top: int = 10, max_gap_s: float = 900.0, topology: Topology | None = None) -> KpiReport:
    """Every telemetry KPI of one scope over [start, end] in buckets of step_s. With a sharded `topology`,
    across the shards that answer: each shard aggregates its own samples (service/kpis/sharded.py), the
    partial aggregates are merged here, and the report names the pods of the shards that did not answer
    (`missing_pods`)."""
    if topology is not None and topology.sharded:
        from service.kpis.sharded import fabric_kpis_across_shards

        return fabric_kpis_across_shards(conn=conn, topology=topology, scope=scope, start=start, end=end,
                                         step_s=step_s, top=top, max_gap_s=max_gap_s)
    kw: dict[str, Any] = {"conn": conn, "scope": scope, "start": start, "end": end, "max_gap_s": max_gap_s}
    return KpiReport(
        scope=scope.value, start=start, end=end, step_s=step_s, source=pick_source(step_s).name,
        labels=group_labels(conn=conn, scope=scope),
        utilization=utilization(step_s=step_s, **kw), congestion=congestion(step_s=step_s, **kw),
        availability=availability(step_s=step_s, **kw), worst_ports=worst_ports(top=top, **kw))


KPI_METRICS = [*UTIL_METRICS, *CONGESTION_RATES, *AVAIL_METRICS]


# --- fault recovery times ----------------------------------------------------------------------

DEFAULT_MITIGATION_TARGET_S = 300.0


@dataclass(frozen=True)
class Timeline:
    """What recovery times need from one incident; times are data time (None: not reached)."""

    incident_id: int
    cause: str | None
    pod: str | None
    onset: datetime | None          # the fault's onset, when one before the first alert was recorded
    first_alert: datetime | None
    drained: datetime | None
    returned: datetime | None


@dataclass
class Durations:
    incident_id: int
    cause: str
    pod: str
    detect_s: float | None
    mitigate_s: float | None
    restore_s: float | None
    mitigation_met: bool | None     # None: not drained yet


@dataclass
class Stats:
    count: int
    p50: float | None
    p90: float | None
    p95: float | None
    max: float | None


@dataclass
class GroupStats:
    incidents: int
    detect: Stats
    mitigate: Stats
    restore: Stats
    mitigation_within_target: float | None   # share of drained incidents mitigated within the target


@dataclass
class RecoveryReport:
    mitigation_target_s: float
    overall: GroupStats
    by_cause: dict[str, GroupStats]
    by_pod: dict[str, GroupStats]
    incidents: list[Durations]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (PostgreSQL percentile_cont, numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values: Iterable[float | None]) -> Stats:
    xs = [v for v in values if v is not None]
    return Stats(len(xs), percentile(xs, 0.5), percentile(xs, 0.9), percentile(xs, 0.95), max(xs) if xs else None)


def _secs(a: datetime | None, b: datetime | None) -> float | None:
    return (b - a).total_seconds() if a is not None and b is not None else None


def durations(t: Timeline, target_s: float = DEFAULT_MITIGATION_TARGET_S) -> Durations:
    detect = _secs(t.onset, t.first_alert)
    mitigate = _secs(t.first_alert, t.drained)
    return Durations(t.incident_id, t.cause or "unknown", t.pod or "unknown",
                     max(detect, 0.0) if detect is not None else None, mitigate,
                     _secs(t.drained, t.returned), None if mitigate is None else mitigate <= target_s)


def _group(ds: list[Durations]) -> GroupStats:
    judged = [d.mitigation_met for d in ds if d.mitigation_met is not None]
    return GroupStats(len(ds), _stats(d.detect_s for d in ds), _stats(d.mitigate_s for d in ds),
                      _stats(d.restore_s for d in ds), sum(judged) / len(judged) if judged else None)


def recovery_times(timelines: Iterable[Timeline], *,
                   mitigation_target_s: float = DEFAULT_MITIGATION_TARGET_S) -> RecoveryReport:
    """Time to detect, mitigate and restore per incident, with percentiles overall, per cause and per pod."""
    ds = [durations(t, mitigation_target_s) for t in timelines]
    by_cause: dict[str, list[Durations]] = defaultdict(list)
    by_pod: dict[str, list[Durations]] = defaultdict(list)
    for d in ds:
        by_cause[d.cause].append(d)
        by_pod[d.pod].append(d)
    return RecoveryReport(mitigation_target_s, _group(ds), {k: _group(v) for k, v in sorted(by_cause.items())},
                          {k: _group(v) for k, v in sorted(by_pod.items())}, ds)


_TIMELINES_SQL = """
SELECT i.id, i.cause, i.pod, i.fault_at, i.opened_at,
       {alert_first} AS first_alert_ms, {evidence_onset} AS onset_ms,
       (SELECT min(e.ts) FROM incident_events e WHERE e.incident_id = i.id AND e.to_state = 'drained') AS drained,
       (SELECT min(e.ts) FROM incident_events e WHERE e.incident_id = i.id AND e.to_state = 'returned_to_service')
         AS returned
FROM incidents i {alert_join}
WHERE i.opened_at >= :start AND i.opened_at < :end
  AND i.state <> 'false_alarm'
ORDER BY i.id
"""


def load_timelines(*, conn: Connection, start: datetime, end: datetime) -> list[Timeline]:
    """Incident timelines opened in [start, end); false alarms are left out (no fault to recover from)."""
    if not conn.execute(text("SELECT to_regclass('incidents') IS NOT NULL")).scalar_one():
        return []
    has_alerts = conn.execute(text("SELECT to_regclass('alerts') IS NOT NULL")).scalar_one()
    if has_alerts:
        # Evidence may carry its own onset: detection's {"feature": "onset_ms", "value": ms} (when the condition
        # first held, data time) or an {"onset_ms": ms} key; the earliest of the last and the peak cycle's.
        # Else the fault time the incident recorded.
        sql = _TIMELINES_SQL.format(
            alert_first="a.first_opened_at_ms",
            evidence_onset="(SELECT min(COALESCE((ev->>'onset_ms')::float8, (ev->>'value')::float8))::bigint "
                           "FROM jsonb_array_elements(a.evidence || COALESCE(a.peak_evidence, '[]'::jsonb)) ev "
                           "WHERE ev ? 'onset_ms' OR ev->>'feature' = 'onset_ms')",
            alert_join="LEFT JOIN alerts a ON a.id = i.alert_id")
    else:
        sql = _TIMELINES_SQL.format(alert_first="NULL::bigint", evidence_onset="NULL::bigint", alert_join="")
    out = []
    for r in conn.execute(text(sql), {"start": start, "end": end}):
        tz = r.opened_at.tzinfo
        first = datetime.fromtimestamp(r.first_alert_ms / 1000, tz) if r.first_alert_ms is not None else r.opened_at
        onset = datetime.fromtimestamp(r.onset_ms / 1000, tz) if r.onset_ms is not None else r.fault_at
        # The detection pipeline opens its incidents with the alert (fault_at = the alert's time) and its
        # evidence carries no onset_ms: such an onset is no measurement, so time to detect is unknown, not 0.
        known = onset is not None and onset < first
        out.append(Timeline(r.id, r.cause, r.pod, onset if known else None, first, r.drained, r.returned))
    return out
