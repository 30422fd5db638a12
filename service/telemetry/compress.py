"""Compression: samples past the hot window move from rows and import blocks into chunks.

A run (the `compress_samples` beat task) works up to the cutoff: the last whole hour before
`now - hot window`, and never past the 5-minute rollup watermark (the rollups read raw samples of
the buckets they compute; chunks would only cost them a decode). Before the rollups' first run, the hours
it compresses are marked for their back-fill (service/telemetry/backfill.py). From the watermark
(`chunk_watermark`) it takes one period at a time: a whole UTC day when the whole day lies before
the cutoff (a backlog, history), else one hour. Each period is moved a batch of series at a time,
each batch one transaction:

    COPY (DELETE FROM sample_rows WHERE <series batch> AND <period> RETURNING ...) TO STDOUT
    -> merge with the chunks those samples overlap (late rows) -> encode -> COPY into sample_chunks

The rows deleted are exactly the rows encoded (a row committed meanwhile is not deleted), and the
deletion commits with the chunks: a run killed at any point leaves each batch either all rows or
all chunks, and the next run goes on from there. Memory is bounded by the batch (series x period).

Late rows: rows that arrive for an hour already compressed stay rows, read with the chunks by every
reader (service/telemetry/store.py), until their day closes: then the day's remaining rows are merged
into its chunks (a duplicate of a chunk's sample is dropped, the chunk's reading kept) and the day's
partition, empty, is truncated (its disk space back at once, without a vacuum). Once a day lies wholly
before the watermark, its hourly chunks are merged into one per series (`compacted_until`): a chunk's
row, key and zstd frame cost about 0.8 byte per sample at an hour of 10 s samples. Import blocks ending
before the cutoff become chunks the same way.

After a run, what it wrote is analyzed and its BRIN ranges summarized, and the row partitions it
deleted from are vacuumed, so none of it waits for autovacuum (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from service.telemetry.backfill import Hours
from service.telemetry.chunk_codec import decode, encode
from service.telemetry.partitions import (
    chunk_partition_name,
    create_partitions,
    ensure_chunk_partitions,
    existing_partitions,
    partition_name,
    summarize_new_ranges,
)
from service.telemetry.store import Samples, copy_out, copy_rows_and_chunks, merge, per_series

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
_DAY_US = 86_400_000_000
_LOCK_KEY = 74_201_300  # one compression run at a time (a session lock: a killed run frees it)
_MAX_SID = 2**31 - 1
_TRUNCATE_WAIT_MS = 2000
_CHUNK_TYPES = ["int4", "timestamptz", "timestamptz", "int4", "float8", "timestamptz", "float8", "bytea"]


@dataclass
class CompressRun:
    periods: int = 0
    batches: int = 0
    samples: int = 0      # samples moved from rows and blocks into chunks
    chunks: int = 0       # chunks written
    remerged: int = 0     # samples of existing chunks encoded again with late rows
    duplicates: int = 0   # rows dropped as repeats of a sample a chunk holds
    blocks: int = 0       # import-block samples among `samples`
    compacted: int = 0    # hourly chunks of closed days merged into one per series and day
    days_closed: list[str] = field(default_factory=list)
    done_until: datetime | None = None
    busy: bool = False
    complete: bool = True  # False when the run stopped at its batch limit with work left

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "done_until"}
        out["done_until"] = self.done_until.isoformat() if self.done_until else None
        return out


def _ts(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


def _floor(t: datetime, step: timedelta) -> datetime:
    return EPOCH + (t - EPOCH) // step * step


def _raw(conn: Connection) -> psycopg.Connection[Any]:
    return conn.connection.driver_connection  # type: ignore[return-value]


# -- chunks ---------------------------------------------------------------------------------------

def _groups(s: Samples) -> Iterator[tuple[int, int]]:
    """(start, end) index ranges of one series and UTC day each; `s` sorted by series and time."""
    if not len(s):
        return
    day = s.ts_us // _DAY_US
    cut = np.nonzero((s.sid[1:] != s.sid[:-1]) | (day[1:] != day[:-1]))[0] + 1
    bounds = [0, *cut.tolist(), len(s)]
    yield from zip(bounds[:-1], bounds[1:], strict=False)


_OVERLAP_SQL = """
SELECT c.series_id, c.first_ts, c.data FROM sample_chunks c
JOIN unnest(%(sid)s::int[], %(lo)s::timestamptz[], %(hi)s::timestamptz[]) AS q(sid, lo, hi)
  ON c.series_id = q.sid AND c.first_ts <= q.hi AND c.last_ts >= q.lo
WHERE c.first_ts >= %(day)s AND c.first_ts <= %(top)s
"""


def write_chunks(cur: psycopg.Cursor[Any], new: Samples, run: CompressRun) -> None:
    """Store `new` (sorted by series and time, one sample per time) as chunks, merged with the stored
    chunks whose span overlaps theirs (per series and day), which are replaced."""
    if not len(new):
        return
    spans = list(_groups(new))
    params = {"sid": [int(new.sid[a]) for a, _ in spans], "lo": [_ts(new.ts_us[a]) for a, _ in spans],
              "hi": [_ts(new.ts_us[b - 1]) for _, b in spans],
              "day": _ts(int(new.ts_us.min()) // _DAY_US * _DAY_US), "top": _ts(int(new.ts_us.max()))}
    old_sid, old_first, parts = [], [], []
    for sid, first, data in cur.execute(_OVERLAP_SQL, params, binary=True):
        ts, vals = decode(data)
        old_sid.append(sid)
        old_first.append(first)
        parts.append(Samples(np.full(len(ts), sid, np.int64), ts, vals))
    if parts:
        old = Samples(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("sid", "ts_us", "value")))
        cur.execute("DELETE FROM sample_chunks WHERE (series_id, first_ts) IN "
                    "(SELECT * FROM unnest(%s::int[], %s::timestamptz[]))", [old_sid, old_first])
        new, dups = merge(old, new)
        run.remerged += len(old)
        run.duplicates += dups
    groups = list(_groups(new))
    ensure_chunk_partitions(cur, sorted({_ts(int(new.ts_us[a])).date() for a, _ in groups}))
    with cur.copy("COPY sample_chunks (series_id, first_ts, last_ts, n, last_value, prev_ts, prev_value, data) "
                  "FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(_CHUNK_TYPES)
        for a, b in groups:
            ts, vals = new.ts_us[a:b], new.value[a:b]
            n = b - a
            cp.write_row((int(new.sid[a]), _ts(ts[0]), _ts(ts[-1]), n, float(vals[-1]),
                          _ts(ts[-2]) if n > 1 else None, float(vals[-2]) if n > 1 else None, encode(ts, vals)))
    run.chunks += len(groups)


# -- moving rows and blocks -------------------------------------------------------------------------

def _series_batches(cur: psycopg.Cursor[Any], size: int, ids: list[int] | None = None) -> list[tuple[int, int]]:
    """Inclusive id ranges of about `size` series each, covering every id from 0 on."""
    if ids is None:
        ids = [r[0] for r in cur.execute("SELECT id FROM series ORDER BY id")]
    out, lo = [], 0
    for i in range(size - 1, len(ids), size):
        out.append((lo, ids[i]))
        lo = ids[i] + 1
    if lo <= _MAX_SID:
        out.append((lo, _MAX_SID))
    return out


# both return a row of arrays per series (store.per_series) or block: a row per sample costs the client more
_MOVE_ROWS = ("WITH d AS (DELETE FROM sample_rows WHERE series_id BETWEEN %(a)s AND %(b)s AND ts >= %(lo)s "
              "AND ts < %(hi)s RETURNING series_id, ts, value) " + per_series("SELECT * FROM d"))
_MOVE_BLOCKS = ("DELETE FROM sample_blocks WHERE series_id BETWEEN %(a)s AND %(b)s AND last_ts < %(hi)s "
                "RETURNING series_id, ts, vals")


def _move(engine: Engine, query: str, params: dict[str, Any], run: CompressRun, *, blocks: bool = False) -> None:
    """One batch, one transaction: delete what `query` returns and store it as chunks."""
    with engine.begin() as conn, _raw(conn).cursor() as cur:
        got = copy_out(cur, query, params)
        if len(got):
            new, dups = merge(Samples.empty(), got)  # sorted, and a block may repeat a row's sample
            run.duplicates += dups
            write_chunks(cur, new, run)
            run.samples += len(new)
            if blocks:
                run.blocks += len(new)
    run.batches += 1


def _compact(engine: Engine, partition: str, a: int, b: int, run: CompressRun) -> None:
    """One batch, one transaction: the day's chunks of series a..b that have more than one, as one each."""
    with engine.begin() as conn, _raw(conn).cursor() as cur:
        _, chunks = copy_rows_and_chunks(cur, (
            f"DELETE FROM {partition} WHERE series_id IN (SELECT series_id FROM {partition} "
            "WHERE series_id BETWEEN %(a)s AND %(b)s GROUP BY 1 HAVING count(*) > 1) "
            "RETURNING series_id, NULL::timestamptz[], NULL::float8[], data"), {"a": a, "b": b})
        if chunks:
            parts = [(sid, *decode(data)) for sid, data in chunks]
            got = Samples(np.concatenate([np.full(len(ts), sid, np.int64) for sid, ts, _ in parts]),
                          np.concatenate([ts for _, ts, _ in parts]), np.concatenate([v for _, _, v in parts]))
            new, dups = merge(Samples.empty(), got)
            run.duplicates += dups
            run.compacted += len(chunks)
            write_chunks(cur, new, run)
    run.batches += 1


# -- the run ---------------------------------------------------------------------------------------

def watermark(conn: Connection) -> datetime | None:
    return conn.execute(text("SELECT done_until FROM chunk_watermark")).scalar_one_or_none()


def _set_watermark(conn: Connection, t: datetime) -> None:
    conn.execute(text("INSERT INTO chunk_watermark (id, done_until) VALUES (true, :t) ON CONFLICT (id) "
                      "DO UPDATE SET done_until = excluded.done_until, updated_at = now()"), {"t": t})


def _mark_for_rollups(conn: Connection, lo: datetime, hi: datetime) -> None:
    """Before the rollups' first run nothing holds compression back, and their first run starts at the
    oldest day still holding rows: the hours compressed until then are marked for their back-fill (the
    mark is a no-op once the 5-minute watermark exists, as compression then stays behind it)."""
    hours = Hours()
    hours.add_times(np.array([int(lo.timestamp() * 1000), int(hi.timestamp() * 1000) - 1]))
    with _raw(conn).cursor() as cur:
        hours.mark(cur, with_blocks=True)


def cutoff(conn: Connection, now: datetime, hot_s: float) -> datetime:
    """Compress before this: whole hours past the hot window, not past the 5-minute rollup watermark."""
    out = _floor(now - timedelta(seconds=hot_s), HOUR)
    rolled = conn.execute(text("SELECT done_until FROM rollup_watermarks WHERE level = '5m'")).scalar_one_or_none()
    return min(out, _floor(rolled, HOUR)) if rolled is not None else out


def _oldest_rows(conn: Connection, limit: datetime) -> datetime | None:
    for day, name in sorted(existing_partitions(conn).items()):
        if datetime(day.year, day.month, day.day, tzinfo=UTC) >= limit:
            return None
        if conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name})")).scalar():
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
    return None


def _has_rows(engine: Engine, lo: datetime, hi: datetime) -> bool:
    """Whether any row lies in [lo, hi): an empty period (the hours before a fresh install's first
    samples, a gap in collection) costs one look instead of a DELETE per series batch, 45 ms each at
    the 4,096-GPU fabric (its first run walked 2,000 empty batches in 90 s, under ingest)."""
    with engine.begin() as conn:
        summarize_new_ranges(conn, lo.date(), (hi - timedelta(microseconds=1)).date())
        conn.execute(text("SET LOCAL enable_seqscan = off"))  # the BRIN on ts, as the rollups read it
        return bool(conn.execute(text("SELECT EXISTS (SELECT 1 FROM sample_rows WHERE ts >= :lo AND ts < :hi)"),
                                 {"lo": lo, "hi": hi}).scalar())


def run_compression(engine: Engine, *, now: datetime, hot_s: float = 3600.0, batch_series: int = 2000,
                    max_batches: int = 1000) -> CompressRun:
    """Compress up to `max_batches` batches of what lies before the cutoff (see the module's doc)."""
    run = CompressRun()
    # autocommit: an open transaction here would hold back what VACUUM may remove
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as lock_conn:
        if not lock_conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _LOCK_KEY}).scalar_one():
            run.busy = True
            return run
        try:
            _run(engine, run, now=now, hot_s=hot_s, batch_series=batch_series, max_batches=max_batches)
        finally:
            lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})
    return run


def _run(engine: Engine, run: CompressRun, *, now: datetime, hot_s: float, batch_series: int,
         max_batches: int) -> None:
    with engine.begin() as conn:
        limit = cutoff(conn, now, hot_s)
        wm = watermark(conn)
        start = wm if wm is not None else _oldest_rows(conn, limit)
        with _raw(conn).cursor() as cur:
            hour_batches = _series_batches(cur, batch_series)
            day_batches = _series_batches(cur, max(1, batch_series // 24))
            block_ids = [r[0] for r in cur.execute(
                "SELECT DISTINCT series_id FROM sample_blocks WHERE last_ts < %s ORDER BY 1", [limit])]
    run.done_until = wm
    touched: set[date] = set()
    written: set[date] = set()
    rewrite: set[date] = set()  # chunk partitions compacted: their hourly chunks are dead space now

    def budget() -> bool:
        if run.batches >= max_batches:
            run.complete = False
            return False
        return True

    # 1. periods after the watermark: whole days while they fit, then hours
    t = start
    while t is not None and t < limit:
        step = DAY if t == _floor(t, DAY) and t + DAY <= limit else HOUR
        batches = (day_batches if step == DAY else hour_batches) if _has_rows(engine, t, t + step) else []
        for a, b in batches:
            if not budget():
                return _finish(engine, run, touched, written, rewrite)
            _move(engine, _MOVE_ROWS, {"a": a, "b": b, "lo": t, "hi": t + step}, run)
        touched.add(t.date())
        written.add(t.date())
        with engine.begin() as conn:
            _set_watermark(conn, t + step)
            if batches:
                _mark_for_rollups(conn, t, t + step)
        t += step
        run.periods += 1
        run.done_until = t
    done = run.done_until or limit
    # 2. closed days (wholly before the watermark): merge their late rows, then truncate them
    with engine.begin() as conn:
        parts = existing_partitions(conn)
        closed_until = conn.execute(text("SELECT compacted_until FROM chunk_watermark")).scalar_one_or_none()
    for day, name in sorted(parts.items()):
        day_start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        if day_start + DAY > done:
            break
        with engine.begin() as conn:
            # A day closed before is truncated: only a late row makes it non-empty. A day closing now
            # is truncated even when a vacuum left its heap empty: that resets its indexes too.
            closed = closed_until is not None and day_start < closed_until
            if closed and not conn.execute(text("SELECT pg_relation_size(CAST(:n AS regclass)) > 0"),
                                           {"n": name}).scalar():
                continue
            late = conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name})")).scalar()
        if late:
            for a, b in day_batches:
                if not budget():
                    return _finish(engine, run, touched, written, rewrite)
                _move(engine, _MOVE_ROWS, {"a": a, "b": b, "lo": day_start, "hi": day_start + DAY}, run)
            written.add(day)
        try:
            with engine.begin() as conn:
                # No row can come in between the check and the truncation: the lock waits for writers.
                # Not for long: readers queue behind a waiting exclusive lock; the next run tries again.
                conn.execute(text(f"SET LOCAL lock_timeout = '{_TRUNCATE_WAIT_MS}ms'"))
                conn.execute(text(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"))
                if not conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name})")).scalar():
                    conn.execute(text(f"TRUNCATE {name}"))
                    run.days_closed.append(name)
                    touched.discard(day)
        except OperationalError as exc:
            if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
                raise
            run.complete = False
    # 3. days wholly before the watermark: a chunk per series and day instead of one per hour
    if run.done_until is not None:
        with engine.begin() as conn:
            compacted = conn.execute(text("SELECT compacted_until FROM chunk_watermark")).scalar_one_or_none()
            chunk_days = existing_partitions(conn, "sample_chunks")
        for day, name in sorted(chunk_days.items()):
            day_start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if day_start + DAY > done:
                break
            if compacted is not None and day_start < compacted:
                continue
            with engine.begin() as conn, _raw(conn).cursor() as cur:
                ids = [r[0] for r in cur.execute(f"SELECT series_id FROM {name} GROUP BY 1 HAVING count(*) > 1 "
                                                 "ORDER BY 1")]
                batches = _series_batches(cur, max(1, batch_series // 24), ids) if ids else []
            for a, b in batches:
                if not budget():
                    return _finish(engine, run, touched, written, rewrite)
                _compact(engine, name, a, b, run)
            written.add(day)
            if batches:
                rewrite.add(day)
            with engine.begin() as conn:
                conn.execute(text("UPDATE chunk_watermark SET compacted_until = :t"), {"t": day_start + DAY})
    # 4. import blocks that end before the cutoff
    with engine.begin() as conn, _raw(conn).cursor() as cur:
        block_batches = _series_batches(cur, max(1, batch_series // 24), block_ids) if block_ids else []
    for a, b in block_batches:
        if not budget():
            return _finish(engine, run, touched, written, rewrite)
        _move(engine, _MOVE_BLOCKS, {"a": a, "b": b, "hi": limit}, run, blocks=True)
    return _finish(engine, run, touched, written, rewrite)


def _finish(engine: Engine, run: CompressRun, touched: set[date], written: set[date], rewrite: set[date]) -> None:
    """Statistics and BRIN summaries for what the run wrote, space back in the row partitions it
    deleted from and in the chunk partitions it compacted: nothing waits for autovacuum (which may be
    off), and a closed day's partition, which nothing writes again, is rewritten without its dead chunks."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        chunk_parts = existing_partitions(conn, "sample_chunks")
        for day in sorted(rewrite):
            # VACUUM FULL holds an exclusive lock while it copies the day (its readers wait): never
            # wait long for it; a day left as it is keeps its dead space, nothing else.
            conn.exec_driver_sql(f"SET lock_timeout = '{_TRUNCATE_WAIT_MS}ms'")
            try:
                conn.exec_driver_sql(f"VACUUM FULL {chunk_partition_name(day)}")
            except OperationalError as exc:
                if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
                    raise
                run.complete = False
            finally:
                conn.exec_driver_sql("RESET lock_timeout")
        for day in sorted(written):
            if day in chunk_parts:
                analyze_and_summarize(conn, chunk_partition_name(day))
        rows = existing_partitions(conn)
        for day in sorted(touched):
            if day in rows:
                conn.exec_driver_sql(f"VACUUM (ANALYZE) {partition_name(day)}")
        if run.blocks:
            conn.exec_driver_sql("VACUUM (ANALYZE) sample_blocks")


def analyze_and_summarize(conn: Connection, table: str) -> None:
    """ANALYZE a table and summarize the page ranges of its BRIN indexes not summarized yet."""
    conn.exec_driver_sql(f"ANALYZE {table}")
    conn.exec_driver_sql("SELECT brin_summarize_new_values(i.indexrelid) FROM pg_index i JOIN pg_class c "
                         "ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
                         "WHERE i.indrelid = CAST(%s AS regclass) AND a.amname = 'brin'", (table,))


# -- back to rows -----------------------------------------------------------------------------------

def decompress_all(conn: Connection) -> int:
    """Every chunk's samples back into rows (a downgrade); returns the samples restored."""
    raw = _raw(conn)
    total = 0
    with raw.cursor() as cur:
        cur.execute("CREATE TEMP TABLE chunk_restore (series_id int, ts timestamptz, value float8) ON COMMIT DROP")
        for sid, data in cur.execute("SELECT series_id, data FROM sample_chunks", binary=True).fetchall():
            ts, vals = decode(data)
            with cur.copy("COPY chunk_restore FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(["int4", "timestamptz", "float8"])
                for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
                    cp.write_row((sid, _ts(t), v))
            total += len(ts)
        days = [r[0] for r in cur.execute(
            "SELECT DISTINCT (ts AT TIME ZONE 'UTC')::date FROM chunk_restore")]
        create_partitions(cur, days)
        cur.execute("INSERT INTO sample_rows SELECT * FROM chunk_restore ON CONFLICT DO NOTHING")
        cur.execute("DELETE FROM sample_chunks")
    return total
