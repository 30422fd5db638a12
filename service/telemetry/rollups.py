"""5-minute and 1-hour rollups of `samples`: computed incrementally, kept longer than raw.

Each level has a watermark (`rollup_watermarks.done_until`): every bucket before it is computed.
A run computes the closed buckets after the watermark (a bucket is closed `lag` after its end),
in chunks, each chunk one transaction that upserts its rows and moves the watermark; history is
never rescanned. The 5-minute level reads raw samples; the 1-hour level reads 5-minute rows.

Counters: a bucket's `increase` is the sum of the reset/wrap-aware increases of the steps that
END in it, including the step from the previous bucket's last sample (taken from that bucket's
rollup row, so chunk and bucket boundaries lose nothing); `covered_s` is the time those steps
span. Summing both over buckets gives exactly what raw samples give, so a rate over any range of
whole buckets is `sum(increase) / sum(covered_s)`. The per-step rule is counters.increase,
written once more as SQL (`INCREASE_SQL`), with a test holding the two equal.

Back-fill: samples written behind the watermark (an import, `sim generate --store`, a late sample) are
marked per hour by their writer (service/telemetry/backfill.py), in its transaction; after moving the
watermark each run computes marked hours again, oldest first (`run_backfill`). Rows before a watermark
can therefore change: `rollup_watermarks.revised_at` says when they last did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text

from service.telemetry import catalogue
from service.telemetry.partitions import existing_partitions as raw_partitions
from service.telemetry.partitions import summarize_new_ranges
from service.telemetry.store import merged_between, stage_chunks

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LOCK_BASE = 74_201_200  # + level index: one runner per level; + 10: partition DDL


@dataclass(frozen=True, slots=True)
class Level:
    name: str
    table: str
    bucket_s: int
    chunk_s: int  # one transaction computes this much
    partition_days: int  # partitions are this many days, aligned on the Unix epoch


L5M = Level("5m", "rollup_5m", 300, 3600, 1)
L1H = Level("1h", "rollup_1h", 3600, 86400, 7)
LEVELS = (L5M, L1H)


def floor_to(t: datetime, seconds: int) -> datetime:
    return EPOCH + timedelta(seconds=int((t - EPOCH).total_seconds()) // seconds * seconds)


# counters.increase(prev, cur, bits, saturating) in SQL; {p} prev, {c} cur, {b} bits, {s} saturating.
INCREASE_SQL = """CASE
  WHEN {s} AND {b} IS NOT NULL AND {c} >= power(2::float8, {b}) - 1 THEN NULL
  WHEN {c} >= {p} THEN {c} - {p}
  WHEN {b} IS NOT NULL AND NOT {s} AND power(2::float8, {b}) - {p} + {c} >= 0
       AND power(2::float8, {b}) - {p} + {c} < power(2::float8, {b} - 1) THEN power(2::float8, {b}) - {p} + {c}
  ELSE {c}
END"""

_COLS = "series_id, bucket, n, min, max, avg, last, first_ts, last_ts, increase, covered_s"
_UPSERT = """
ON CONFLICT (series_id, bucket) DO UPDATE SET
  n = excluded.n, min = excluded.min, max = excluded.max, avg = excluded.avg, last = excluded.last,
  first_ts = excluded.first_ts, last_ts = excluded.last_ts, increase = excluded.increase,
  covered_s = excluded.covered_s
WHERE (r.n, r.min, r.max, r.last, r.first_ts, r.last_ts)
  IS DISTINCT FROM (excluded.n, excluded.min, excluded.max, excluded.last, excluded.first_ts, excluded.last_ts)
""" + "".join(
    # Sums of floats depend on the order rows are added in, which the plan may change: a rerun
    # rewrites a row only when a sum really differs, so recomputing a range adds no churn.
    f"  OR (r.{c} IS NULL) <> (excluded.{c} IS NULL)"
    f" OR abs(r.{c} - excluded.{c}) > 1e-12 * greatest(abs(r.{c}), abs(excluded.{c}))\n"
    for c in ("avg", "increase", "covered_s"))

# Raw samples of [lo, hi) plus, per series, the last point before lo (from the 5m rollup row
# within max_gap): lag() then gives every step ending in the chunk, the boundary step included.
_5M_SQL = f"""
INSERT INTO rollup_5m AS r ({_COLS})
WITH ser AS (
  SELECT id, counter_bits AS bits, saturating AS sat, metric = ANY(:counters) AS is_counter FROM series
), prev AS (
  SELECT DISTINCT ON (series_id) series_id, last_ts AS ts, last AS value FROM rollup_5m
  WHERE bucket >= :prev_lo AND bucket < :lo @SERIES@ ORDER BY series_id, bucket DESC
), pts AS (
  SELECT series_id, ts, value, false AS old FROM @SOURCE@ x WHERE ts < :hi @SERIES@
  UNION ALL
  SELECT series_id, ts, value, true FROM prev
), steps AS (
  SELECT series_id, ts, value, old, date_bin(:width, ts, :origin) AS bucket,
         lag(value) OVER w AS pv, lag(ts) OVER w AS pt, lead(ts) OVER w AS nt
  FROM pts WINDOW w AS (PARTITION BY series_id ORDER BY ts)
), incs AS (
  SELECT st.*, CASE WHEN ser.is_counter AND st.pt IS NOT NULL AND st.ts - st.pt <= :max_gap
                    THEN {INCREASE_SQL.format(p="st.pv", c="st.value", b="ser.bits", s="ser.sat")} END AS inc
  FROM steps st JOIN ser ON ser.id = st.series_id
  WHERE NOT st.old
)
SELECT series_id, bucket, count(*), min(value), max(value), avg(value),
       max(value) FILTER (WHERE nt IS NULL OR nt >= bucket + :width), min(ts), max(ts),
       sum(inc), sum(extract(epoch FROM ts - pt)) FILTER (WHERE inc IS NOT NULL)
FROM incs GROUP BY series_id, bucket
{_UPSERT}
"""

# 1h rows are sums of whole 5m rows: increases and covered time add up, the average is weighted.
_1H_SQL = f"""
INSERT INTO rollup_1h AS r ({_COLS})
SELECT series_id, date_bin(:width, bucket, :origin) AS b, sum(n), min(min), max(max), sum(avg * n) / sum(n),
       (array_agg(last ORDER BY bucket DESC))[1], min(first_ts), max(last_ts), sum(increase), sum(covered_s)
FROM rollup_5m WHERE bucket >= :lo AND bucket < :hi
GROUP BY series_id, b
{_UPSERT}
"""


# -- partitions ---------------------------------------------------------------------------------

def _part_start(level: Level, day: date) -> date:
    days = (day - EPOCH.date()).days
    return EPOCH.date() + timedelta(days=days // level.partition_days * level.partition_days)


def existing_partitions(conn: Connection, level: Level) -> dict[date, str]:
    """Partition start day -> name, for one rollup level."""
    pattern = re.compile(rf"^{level.table}_p(\d{{8}})$")
    rows = conn.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t"), {"t": level.table}).scalars()
    out: dict[date, str] = {}
    for name in rows:
        m = pattern.match(name)
        if m:
            out[datetime.strptime(m.group(1), "%Y%m%d").date()] = name
    return out


def ensure_partitions(conn: Connection, level: Level, lo: datetime, hi: datetime) -> list[str]:
    """Create the partitions that hold buckets in [lo, hi)."""
    first = _part_start(level, lo.astimezone(UTC).date())
    last = _part_start(level, (hi - timedelta(microseconds=1)).astimezone(UTC).date())
    wanted = [first + timedelta(days=i) for i in range(0, (last - first).days + 1, level.partition_days)]
    if all(d in existing_partitions(conn, level) for d in wanted):
        return []
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_BASE + 10})
    have = existing_partitions(conn, level)
    created = []
    for day in wanted:
        if day in have:
            continue
        name = f"{level.table}_p{day:%Y%m%d}"
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + timedelta(days=level.partition_days)
        conn.execute(text(f"CREATE TABLE {name} PARTITION OF {level.table} "
                          f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"))
        created.append(name)
    return created


def drop_expired(conn: Connection, level: Level, *, today: date, retention_days: int) -> list[str]:
    """Drop partitions whose every bucket is older than the level's retention (a DROP, never a DELETE)."""
    cutoff = today - timedelta(days=retention_days)
    dropped = []
    for start, name in sorted(existing_partitions(conn, level).items()):
        if start + timedelta(days=level.partition_days) <= cutoff:
            conn.execute(text(f"DROP TABLE {name}"))
            dropped.append(name)
    return dropped


# -- watermarks and runs -------------------------------------------------------------------------

def watermark(conn: Connection, level: Level) -> datetime | None:
    return conn.execute(text("SELECT done_until FROM rollup_watermarks WHERE level = :l"),
                        {"l": level.name}).scalar_one_or_none()


def _set_watermark(conn: Connection, level: Level, t: datetime) -> None:
    conn.execute(text(
        "INSERT INTO rollup_watermarks (level, done_until, updated_at) VALUES (:l, :t, now()) "
        "ON CONFLICT (level) DO UPDATE SET done_until = excluded.done_until, updated_at = now()"),
        {"l": level.name, "t": t})


def _start(conn: Connection, level: Level, wm: datetime | None) -> datetime | None:
    """Where a level resumes: its watermark, but never before the oldest data its source still holds."""
    days = raw_partitions(conn) if level is L5M else existing_partitions(conn, L5M)
    # Empty partitions (created ahead, or emptied) hold nothing to roll up: start at the oldest with rows.
    first = next((d for d, name in sorted(days.items())
                  if (wm is None or d >= wm.date() - timedelta(days=level.partition_days))
                  and conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name})")).scalar()), None)
    if first is None:
        return wm
    oldest = datetime.combine(first, datetime.min.time(), tzinfo=UTC)
    return oldest if wm is None or wm < oldest else wm


def compute_chunk(conn: Connection, level: Level, lo: datetime, hi: datetime, *, max_gap_s: float,
                  series: list[int] | None = None) -> int:
    """Compute (upsert) the buckets of [lo, hi) (of these series ids, 5m level: default all); returns
    the rows inserted or changed."""
    ensure_partitions(conn, level, lo, hi)
    width = timedelta(seconds=level.bucket_s)
    if level is L5M:
        counters = [m.name for m in catalogue.METRICS.values() if m.kind is catalogue.Kind.COUNTER]
        params: dict[str, Any] = {"lo": lo, "hi": hi, "prev_lo": lo - timedelta(seconds=max_gap_s),
                                  "max_gap": timedelta(seconds=max_gap_s), "width": width, "origin": EPOCH,
                                  "counters": counters, "sids": series}
        summarize_new_ranges(conn, params["prev_lo"].date(), hi.date())
        # Compression stays behind the 5-minute watermark, so this is empty unless a range is redone
        # (a back-filled hour: the series are then taken a batch at a time, so what is decoded is bounded).
        sql = _5M_SQL.replace("@SOURCE@", merged_between(":lo", ":hi", stage_chunks(conn, lo, hi, series)))
        sql = sql.replace("@SERIES@", "AND series_id = ANY(:sids)" if series is not None else "")
        # The chunk is a narrow time range of a day partition that keeps growing: the BRIN on ts,
        # summarized just now, is the right path, but on a young partition without statistics the
        # planner picks a scan of the whole day (a 30-minute soak: 57 s per run growing to 260 s).
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        try:
            return conn.execute(text(sql), params).rowcount
        finally:
            conn.execute(text("RESET enable_seqscan"))
    return conn.execute(text(_1H_SQL), {"lo": lo, "hi": hi, "width": width, "origin": EPOCH}).rowcount


@dataclass
class LevelRun:
    level: str
    chunks: int = 0
    rows: int = 0
    done_until: datetime | None = None
    busy: bool = False
    backfilled: int = 0  # marked hours computed again (rollup_backfill)
    backfill_rows: int = 0
    backfill_left: bool = False  # marks left for the next run (its budget spent, or hours not closed yet)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "chunks": self.chunks, "rows": self.rows, "busy": self.busy,
                "done_until": self.done_until.isoformat() if self.done_until else None,
                "backfilled": self.backfilled, "backfill_rows": self.backfill_rows,
                "backfill_left": self.backfill_left}


def run_level(engine: Engine, level: Level, *, now: datetime, lag_s: float, max_gap_s: float,
              max_chunks: int, backfill_series: int = 20_000) -> LevelRun:
    """Compute up to `max_chunks` chunks of closed buckets after the level's watermark, then up to
    `max_chunks` hours marked for back-fill before it (`run_backfill`)."""
    out = _forward(engine, level, now=now, lag_s=lag_s, max_gap_s=max_gap_s, max_chunks=max_chunks)
    if not out.busy:
        run_backfill(engine, level, out, now=now, lag_s=lag_s, max_gap_s=max_gap_s, max_hours=max_chunks,
                     batch_series=backfill_series)
    return out


def _forward(engine: Engine, level: Level, *, now: datetime, lag_s: float, max_gap_s: float,
             max_chunks: int) -> LevelRun:
    out = LevelRun(level.name)
    for _ in range(max_chunks):
        with engine.begin() as conn:
            # One runner per level; a second one (an overlapping beat) finds it busy and leaves.
            if not conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"),
                                {"k": _LOCK_BASE + LEVELS.index(level)}).scalar_one():
                out.busy = True
                return out
            wm = watermark(conn, level)
            lo = _start(conn, level, wm)
            if level is L5M:
                limit = floor_to(now - timedelta(seconds=lag_s), level.bucket_s)
            else:
                # An hour is closed once all of its 5-minute buckets are.
                below = watermark(conn, L5M)
                limit = floor_to(below, level.bucket_s) if below else None
            if lo is None or limit is None or lo >= limit:
                out.done_until = wm
                return out
            lo = floor_to(lo, level.bucket_s)
            hi = min(lo + timedelta(seconds=level.chunk_s), limit)
            out.rows += compute_chunk(conn, level, lo, hi, max_gap_s=max_gap_s)
            _set_watermark(conn, level, hi)
            out.chunks += 1
            out.done_until = hi
    return out


# -- back-fill: hours written behind the watermark (service/telemetry/backfill.py marks them) -------------

_HOUR = timedelta(hours=1)
_MARK_1H = "INSERT INTO rollup_backfill (level, hour) VALUES ('1h', :h)"


def run_backfill(engine: Engine, level: Level, out: LevelRun, *, now: datetime, lag_s: float, max_gap_s: float,
                 max_hours: int, batch_series: int = 20_000) -> None:
    """Compute the level's marked hours again, oldest first (so each hour's first step reads the rollup
    of the hour before, itself recomputed), up to `max_hours`. Each hour is one transaction under the
    level's lock: the ids of its marks read, its buckets upserted (5m: a batch of series at a time; these
    statements start after the read, so they see every sample of those marks' writers), those marks
    deleted (one made meanwhile stays for the next round), and for the 5m level the hour marked for the
    1h level. A run killed at any point leaves the marks, and the next run computes the hour again (the
    upsert changes nothing twice).

    A mark carries the earliest time its writer stored in the hour (`lo`): the hour is computed from
    that bucket on, and at most once a run (marked again meanwhile, it waits for the next run).

    Which marks are work: one from at or after the watermark is not (the forward run reads it later;
    the mark goes). Before a level's first forward run (no watermark): a 5m hour once closed (`lag_s`
    after its end); a 1h hour always (its 5m rows were computed when it was marked)."""
    done: set[datetime] = set()
    for _ in range(max_hours):
        with engine.begin() as conn:
            if not conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"),
                                {"k": _LOCK_BASE + LEVELS.index(level)}).scalar_one():
                out.busy = True
                return
            # an hour marked again while this run computed it (late samples still coming in) waits for the
            # next run: one hour is computed at most once a run
            hour = conn.execute(text("SELECT min(hour) FROM rollup_backfill WHERE level = :l AND hour <> ALL(:done)"),
                                {"l": level.name, "done": sorted(done)}).scalar_one()
            if hour is None:
                out.backfill_left = bool(done) and conn.execute(text(
                    "SELECT EXISTS (SELECT 1 FROM rollup_backfill WHERE level = :l)"), {"l": level.name}).scalar_one()
                return
            done.add(hour)
            ids, first = conn.execute(text(
                "SELECT array_agg(id), min(coalesce(lo, hour)) FROM rollup_backfill WHERE level = :l AND hour = :h"),
                {"l": level.name, "h": hour}).one()
            wm = watermark(conn, level)
            # from the bucket of the earliest sample marked: late live samples touch the hour's last buckets
            lo = max(hour, floor_to(first, level.bucket_s))
            hi = hour + _HOUR
            if wm is not None:
                if lo >= wm:
                    _unmark(conn, ids)
                    continue
                hi = min(hi, wm)
            elif level is L5M and hi > floor_to(now - timedelta(seconds=lag_s), level.bucket_s):
                out.backfill_left = True  # not closed yet: marks are taken in hour order, so none after is
                return
            if level is L5M:
                sids = [r[0] for r in conn.execute(text("SELECT id FROM series ORDER BY id"))]
                rows = sum(compute_chunk(conn, level, lo, hi, max_gap_s=max_gap_s, series=sids[i:i + batch_series])
                           for i in range(0, len(sids), batch_series))
                conn.execute(text(_MARK_1H), {"h": floor_to(hour, L1H.bucket_s)})
            else:
                rows = compute_chunk(conn, level, lo, hi, max_gap_s=max_gap_s)
            _unmark(conn, ids)
            conn.execute(text("UPDATE rollup_watermarks SET revised_at = now() WHERE level = :l"), {"l": level.name})
            out.backfilled += 1
            out.backfill_rows += rows
    out.backfill_left = True


def _unmark(conn: Connection, ids: list[int]) -> None:
    """Delete the marks read before the hour was computed; one made since (its samples perhaps committed
    after the computation read) stays for the next round."""
    conn.execute(text("DELETE FROM rollup_backfill WHERE id = ANY(:ids)"), {"ids": ids})


def run_rollups(engine: Engine, *, now: datetime, lag_s: float = 60.0, max_gap_s: float = 900.0,
                max_chunks: int = 24) -> list[LevelRun]:
    """Bring the 5-minute, then the 1-hour level up to date (bounded by `max_chunks` per level)."""
    return [run_level(engine, lv, now=now, lag_s=lag_s, max_gap_s=max_gap_s, max_chunks=max_chunks)
            for lv in LEVELS]


def read_rollup(conn: Connection, level: Level, series_ids: list[int], lo: datetime,
                hi: datetime) -> list[tuple[int, int, int, float, float | None, float | None]]:
    """(series_id, bucket_ms, n, avg, increase, covered_s) for buckets starting in [lo, hi)."""
    if lo >= hi or not series_ids:
        return []
    rows = conn.execute(text(
        f"SELECT series_id, (extract(epoch FROM bucket) * 1000)::bigint, n, avg, increase, covered_s "
        f"FROM {level.table} WHERE series_id = ANY(:sids) AND bucket >= :lo AND bucket < :hi "
        f"ORDER BY series_id, bucket"), {"sids": series_ids, "lo": lo, "hi": hi}).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]
