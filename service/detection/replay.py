"""Reading stored history forward for a replay: each sample once, in time order, a span at a time.

A live cycle reads the samples of (watermark, T - lateness] with one `read_samples` query. A backtest
runs the same cycles over a week of history: one query per cycle would decode a day's import block or
compressed chunk of every series for every minute of it. `HistoryReader` instead reads the history in
spans (by default one UTC day: import blocks and compressed chunks never cross midnight, so each is
decoded once) with the store's one reader (service/telemetry/store.py), orders them by time as a live
read does, and hands each cycle the same (lo, hi] slice a live read of that range would have returned,
grouped by metric the same way. The engine state it feeds is the live one; only the reading differs.

Given the engine, the reader reads the next span on its own connection in a background thread while the
cycles of this one run: the server's half of a read (aggregating a day's rows, streaming it) and the
client's sort by time overlap with the engine's work instead of stopping it once a day.

Memory: two spans of samples (about 24 bytes each, plus the detection metrics' share of a day's rows): the
one being replayed and the one read ahead.

A span's read keeps one sample per (series, time) whenever the span has compressed chunks, where a live
cycle over rows alone may hand over both copies of a re-imported sample (`sample_store.read_samples`);
`observe` ignores a sample not newer than its entity's newest, so the state is the same either way.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy import Connection, Engine

from service.detection.state import USED_METRICS, Fabric
from service.telemetry import store as sample_store

if TYPE_CHECKING:
    from service.detection.service import SeriesIndex

DAY_MS = 86_400_000

Batch = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
_Span = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # (end, series ids, times, values): one span in time order


def _dt_us(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


# Rows per series as arrays; import blocks wholly inside the span as stored (no unnest and re-aggregate: a
# day's blocks are most of a bulk-imported span), blocks crossing its edges cut to it. Ordered by series and
# each part's first time, so the samples usually come out in (series, time) order already.
_SPAN_SQL = """
SELECT series_id, ts, vals FROM (
  SELECT series_id, array_agg(ts ORDER BY ts) AS ts, array_agg(value ORDER BY ts) AS vals, min(ts) AS k
  FROM sample_rows WHERE ts >= %(lo)s AND ts <= %(hi)s GROUP BY series_id
  UNION ALL
  SELECT series_id, ts, vals, first_ts FROM sample_blocks WHERE last_ts >= %(lo)s AND first_ts >= %(lo)s
    AND last_ts <= %(hi)s
  UNION ALL
  SELECT b.series_id, array_agg(u.ts ORDER BY u.ts), array_agg(u.value ORDER BY u.ts), min(u.ts)
  FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
  WHERE b.last_ts >= %(lo)s AND b.first_ts <= %(hi)s AND (b.first_ts < %(lo)s OR b.last_ts > %(hi)s)
    AND u.ts >= %(lo)s AND u.ts <= %(hi)s
  GROUP BY b.series_id, b.first_ts
) x ORDER BY series_id, k"""


def read_span(conn: Connection, lo: datetime, hi: datetime) -> sample_store.Samples:
    """What `sample_store.read_samples(conn, lo, hi)` returns (every stored sample of [lo, hi], sorted by
    series and time, one per (series, time) where chunks are involved), read for a wide span: the server
    ships import blocks inside the span as they are stored instead of unnesting and regrouping them."""
    raw = conn.connection.driver_connection
    with raw.cursor() as cur:  # type: ignore[union-attr]
        rows = sample_store.copy_out(cur, _SPAN_SQL, {"lo": lo, "hi": hi})
        chunks = sample_store.read_chunks(cur, lo, hi)
    rows = rows.in_order()  # parts of one series may overlap (a late row, a re-import)
    if not len(chunks):
        return rows
    return sample_store.merge(chunks, rows)[0]


def group_by_metric(sx: SeriesIndex, sid: np.ndarray, ts_ms: np.ndarray, val: np.ndarray) -> Batch:
    """Samples (in time order) of the metrics detection uses, per metric: (entity, time ms, value)."""
    m = sx.metric_of[sid]
    out: Batch = {}
    for code in np.unique(m[m >= 0]).tolist():
        sel = m == code
        out[USED_METRICS[code]] = (sx.entity_of[sid[sel]], ts_ms[sel], val[sel])
    return out


class HistoryReader:
    """Forward-only reads of (lo, hi] ranges of stored samples, served from spans read in bulk.

    `read(lo, hi)` returns what `service.read_samples(conn, fabric, sx, lo, hi)` returns for that range:
    the detection metrics' samples with lo < ts_ms <= hi, in time order (series id within a time),
    grouped per metric, and the series index (reloaded when a sample names a series newer than it).
    Each call's `lo` must not be before the previous call's `hi`; with `until_ms`, no span is read past
    that time (a read past it still gets its samples, a span at a time). With `read_ahead` (an engine),
    spans are read on a connection of their own in a background thread, the next one (up to `until_ms`)
    while the caller works through this one; `close()` (or `with`) stops it.
    """

    def __init__(self, conn: Connection, fabric: Fabric, span_ms: int = DAY_MS, until_ms: int | None = None,
                 read_ahead: Engine | None = None) -> None:
        if span_ms <= 0:
            raise ValueError("span must be positive")
        self.conn, self.fabric, self.span_ms = conn, fabric, span_ms
        # the last `hi` the replay will ask for: no span reads past it
        self._until_us = until_ms * 1000 + 1 if until_ms is not None else None
        self.samples_read = 0  # stored samples read (all metrics), for the replay benchmark
        self.spans_read = 0
        self._end_us: int | None = None  # the buffer holds every stored sample of [start, end)
        self._sid = np.empty(0, np.int64)
        self._ts_us = np.empty(0, np.int64)
        self._val = np.empty(0, np.float64)
        self._at = 0  # the buffer before this index has been handed out or skipped
        self._last_hi: int | None = None
        self._engine = read_ahead
        self._pool = ThreadPoolExecutor(1, "history-read-ahead") if self._engine is not None else None
        self._ahead: tuple[int, Future[_Span]] | None = None  # (start, its read) of the span read ahead

    def __enter__(self) -> HistoryReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading ahead (a read under way is waited for and dropped)."""
        if self._pool is not None:
            self._ahead = None
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _span_end(self, start_us: int) -> int:
        """The next span boundary after `start_us`: `span_ms` steps from UTC midnight, never past it."""
        start_ms = start_us // 1000
        day = start_ms - start_ms % DAY_MS
        k = (start_ms - day) // self.span_ms + 1
        end = min(day + k * self.span_ms, day + DAY_MS) * 1000
        return min(end, self._until_us) if self._until_us is not None and start_us < self._until_us else end

    def _read_span(self, start_us: int) -> _Span:
        """The stored samples of the span from `start_us`, in time order (series within a time, as live
        orders), and the span's end."""
        end = self._span_end(start_us)
        if self._engine is None:
            got = read_span(self.conn, _dt_us(start_us), _dt_us(end - 1))
        else:
            with self._engine.connect() as conn:
                got = read_span(conn, _dt_us(start_us), _dt_us(end - 1))
        order = np.argsort(got.ts_us, kind="stable")
        return end, got.sid[order], got.ts_us[order], got.value[order]

    def _next_span(self, start_us: int) -> _Span:
        ahead, self._ahead = self._ahead, None
        if self._pool is None:
            span = self._read_span(start_us)
        else:
            if ahead is not None and ahead[0] != start_us:  # the caller jumped past it
                ahead[1].cancel()
                ahead = None
            span = (ahead[1] if ahead is not None else self._pool.submit(self._read_span, start_us)).result()
            if self._until_us is not None and span[0] < self._until_us:
                self._ahead = (span[0], self._pool.submit(self._read_span, span[0]))
        self.samples_read += len(span[1])
        self.spans_read += 1
        return span

    def _load(self, start_us: int, need_us: int) -> None:
        """Read spans from `start_us` until the buffer reaches `need_us` (exclusive)."""
        sids, times, vals = [self._sid[self._at:]], [self._ts_us[self._at:]], [self._val[self._at:]]
        end = start_us
        while end < need_us:
            end, sid, ts, val = self._next_span(end)
            sids.append(sid)
            times.append(ts)
            vals.append(val)
        if len(sids) == 2 and not len(sids[0]):  # the usual case: nothing left of the span before
            self._sid, self._ts_us, self._val = sids[1], times[1], vals[1]
        else:
            self._sid, self._ts_us, self._val = np.concatenate(sids), np.concatenate(times), np.concatenate(vals)
        self._at, self._end_us = 0, end

    def read(self, lo_ms: int, hi_ms: int, sx: SeriesIndex) -> tuple[Batch, SeriesIndex]:
        if self._last_hi is not None and lo_ms < self._last_hi:
            raise ValueError(f"replay reads go forward: ({lo_ms}, {hi_ms}] starts before {self._last_hi}")
        self._last_hi = hi_ms
        # a live read takes ts in [lo, hi] (microseconds) and keeps ts_ms > lo
        first_us, stop_us = (lo_ms + 1) * 1000, hi_ms * 1000 + 1
        if stop_us <= first_us:
            return {}, sx
        if self._end_us is None or first_us > self._end_us:
            self._sid, self._ts_us, self._val, self._at = self._sid[:0], self._ts_us[:0], self._val[:0], 0
            self._load(first_us, stop_us)
        elif stop_us > self._end_us:
            self._load(self._end_us, stop_us)
        ts = self._ts_us
        i = self._at + int(np.searchsorted(ts[self._at:], first_us, "left"))
        j = i + int(np.searchsorted(ts[i:], stop_us, "left"))
        self._at = j
        if i == j:
            return {}, sx
        sid = self._sid[i:j]
        if sid.max() > sx.max_id:
            from service.detection.service import load_series

            sx = load_series(self.conn, self.fabric, sx)
        known = sid <= sx.max_id
        return group_by_metric(sx, sid[known], ts[i:j][known] // 1000, self._val[i:j][known]), sx
