"""Reading stored samples: hot rows, import blocks and compressed chunks, as one set.

`raw_rows_between(lo, hi)` (SQL) reads rows and blocks; chunks are zstd frames that only Python
decodes. Every service reader of a time range comes through here (`samples_between`, for Grafana,
stands in 5-minute rollup readings for the compressed time; the service reads the samples themselves):

- `read_samples` returns numpy arrays (series, time, value) of everything in [lo, hi], for readers
  in Python (`/api/v1/series`, detection, incident soaks);
- `newest_between` returns each series' newest sample in [lo, hi], a probe per series (drains' "down now");
- `stage_chunks` decodes the chunks of a range into the session's temp table `chunk_samples`, for
  readers whose work is SQL (KPIs, rollups): they read `merged_between(lo, hi)`, rows and
  blocks plus the staged chunk samples, in the same transaction.

A sample both in a chunk and in the rows (a late duplicate, until compression merges it) is the
same reading: `read_samples` keeps the chunk's; `merged_between` may see both for that while.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg

from service.telemetry.chunk_codec import decode
from service.telemetry.copy_format import HEADER, TRAILER, pack_rows_us

if TYPE_CHECKING:
    from sqlalchemy import Connection

_PG_EPOCH_US = 946_684_800_000_000


@dataclass(frozen=True)
class Samples:
    """Samples as parallel arrays: int64 series ids, int64 Unix microseconds, float64 values."""

    sid: np.ndarray
    ts_us: np.ndarray
    value: np.ndarray

    def __len__(self) -> int:
        return len(self.sid)

    @property
    def ts_ms(self) -> np.ndarray:
        return self.ts_us // 1000

    @classmethod
    def empty(cls) -> Samples:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))

    def take(self, idx: np.ndarray) -> Samples:
        return Samples(self.sid[idx], self.ts_us[idx], self.value[idx])

    def in_order(self) -> Samples:
        """Sorted by (series, time), stably: as it is when it is (checked), else sorted."""
        s, t = self.sid, self.ts_us
        if len(s) and ((s[1:] < s[:-1]) | ((s[1:] == s[:-1]) & (t[1:] < t[:-1]))).any():
            return self.take(np.lexsort((t, s)))
        return self

    def strictly_sorted(self) -> bool:
        """Sorted by (series, time) with no (series, time) twice: what a sort and a dedup would leave as is."""
        s, t = self.sid, self.ts_us
        return bool(((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (t[1:] > t[:-1]))).all())


def _us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _day_floor(t: datetime) -> datetime:
    u = t.astimezone(UTC)
    return datetime(u.year, u.month, u.day, tzinfo=UTC)


_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_ARRAY_HEAD = struct.Struct(">iiii")  # ndim, has-nulls, element type, length (then the lower bound if ndim)
_TS_ELEM, _VALUE_ELEM = np.dtype([("len", ">i4"), ("v", ">i8")]), np.dtype([("len", ">i4"), ("v", ">f8")])
_SID_ELEM = np.dtype([("len", ">i4"), ("v", ">i4")])


def _array(view: memoryview, at: int, size: int, elem: np.dtype) -> np.ndarray:
    ndim, _, _, n = _ARRAY_HEAD.unpack_from(view, at)
    if not ndim:
        return np.empty(0, elem["v"])
    return np.frombuffer(view, elem, n, at + 20)["v"]


def _copy_rows(view: memoryview, what: str) -> Iterator[list[tuple[int, int]]]:
    """Each row of a binary COPY TO: its fields as (offset, size), size -1 for NULL. `what` names the rows
    expected, for the error when the bytes are not such a COPY."""
    if len(view) <= len(HEADER) + len(TRAILER):
        return
    if bytes(view[:len(HEADER)]) != HEADER or bytes(view[-2:]) != TRAILER:
        raise ValueError(f"not a binary COPY of {what} rows")
    at, end = len(HEADER), len(view) - 2
    while at < end:
        (fields,) = _I16.unpack_from(view, at)
        at += 2
        cells = []
        for _ in range(fields):
            (size,) = _I32.unpack_from(view, at)
            cells.append((at + 4, size))
            at += 4 + max(size, 0)
        yield cells


def parse_copy(buf: bytes | bytearray | memoryview) -> tuple[Samples, list[tuple[int, bytes]]]:
    """A binary COPY TO of (series_id int, ts timestamptz[], value float8[][, data bytea]) rows: the arrays
    flattened (in row order), and the (series_id, chunk) pairs of the rows that carry a chunk instead.
    A row per series and period instead of a row per sample: a COPY message costs the client a Python
    step each, about 4 us, more than the rest of the work."""
    view = memoryview(buf)
    sids, times, values, chunks = [], [], [], []
    for cells in _copy_rows(view, "(series_id, ts[], value[], data)"):
        (sid,) = _I32.unpack_from(view, cells[0][0])
        if cells[1][1] >= 0:
            ts = _array(view, cells[1][0], cells[1][1], _TS_ELEM)
            sids.append(np.full(len(ts), sid, np.int64))
            times.append(ts.astype(np.int64) + _PG_EPOCH_US)
            values.append(_array(view, cells[2][0], cells[2][1], _VALUE_ELEM).astype(np.float64))
        if len(cells) > 3 and cells[3][1] >= 0:
            chunks.append((sid, bytes(view[cells[3][0]:cells[3][0] + cells[3][1]])))
    return _rows(sids, times, values), chunks


def parse_copy_grouped(buf: bytes | bytearray | memoryview) -> Samples:
    """A binary COPY TO of (series_id int[], ts timestamptz[], value float8[]) rows, arrays of one length in
    each row, none NULL (`_GROUPED_SQL`): the arrays concatenated, a Python step per row."""
    view = memoryview(buf)
    sids, times, values = [], [], []
    for row, cells in enumerate(_copy_rows(view, "(series_id[], ts[], value[])")):
        if len(cells) != 3 or min(size for _, size in cells) < 0:
            raise ValueError(f"binary COPY row {row}: {len(cells)} fields, expected 3 arrays, none NULL")
        sid = _array(view, *cells[0], _SID_ELEM)
        ts = _array(view, *cells[1], _TS_ELEM)
        value = _array(view, *cells[2], _VALUE_ELEM)
        if not len(sid) == len(ts) == len(value):
            raise ValueError(f"binary COPY row {row}: arrays of {len(sid)}, {len(ts)} and {len(value)} elements")
        sids.append(sid.astype(np.int64))
        times.append(ts.astype(np.int64) + _PG_EPOCH_US)
        values.append(value.astype(np.float64))
    return _rows(sids, times, values)


def _rows(sids: list[np.ndarray], times: list[np.ndarray], values: list[np.ndarray]) -> Samples:
    return (Samples(np.concatenate(sids), np.concatenate(times), np.concatenate(values)) if sids
            else Samples.empty())


def parse_result(res: Any) -> tuple[Samples, list[tuple[int, bytes]]]:
    """The binary result (a psycopg `PGresult`) of a query returning (series_id int, ts timestamptz[],
    value float8[], data bytea) rows: what `parse_copy` returns for the same rows in a binary COPY (the
    binary format of a value is the same in both)."""
    sids, times, values, chunks = [], [], [], []
    for i in range(res.ntuples):
        (sid,) = _I32.unpack(res.get_value(i, 0))
        ts_cell = res.get_value(i, 1)
        if ts_cell is not None:
            ts = _array(memoryview(ts_cell), 0, len(ts_cell), _TS_ELEM)
            sids.append(np.full(len(ts), sid, np.int64))
            times.append(ts.astype(np.int64) + _PG_EPOCH_US)
            value_cell = res.get_value(i, 2)
            values.append(_array(memoryview(value_cell), 0, len(value_cell), _VALUE_ELEM).astype(np.float64))
        data = res.get_value(i, 3)
        if data is not None:
            chunks.append((sid, data))
    return _rows(sids, times, values), chunks


def copy_rows_and_chunks(cur: psycopg.Cursor[Any], query: str, params: dict[str, Any] | list[Any] | None
                         ) -> tuple[Samples, list[tuple[int, bytes]]]:
    """Run `COPY (query) TO STDOUT` in binary; the query returns (series_id, ts[], value[], data) rows
    (`parse_copy`)."""
    return parse_copy(copy_bytes(cur, query, params))


def copy_bytes(cur: psycopg.Cursor[Any], query: str, params: dict[str, Any] | list[Any] | None) -> bytearray:
    """The bytes of `COPY (query) TO STDOUT` in binary."""
    buf = bytearray()
    with cur.copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)", params) as cp:
        for data in cp:
            buf += data
    return buf


def copy_out(cur: psycopg.Cursor[Any], query: str, params: dict[str, Any] | list[Any] | None = None) -> Samples:
    """Run `COPY (query) TO STDOUT` in binary; the query returns (series_id int, ts timestamptz[],
    value float8[]) rows (`per_series`)."""
    return copy_rows_and_chunks(cur, query, params)[0]


def per_series(rows: str) -> str:
    """SQL turning a query of (series_id, ts, value) rows into one row of arrays per series, in time order."""
    return (f"SELECT series_id, array_agg(ts ORDER BY ts), array_agg(value ORDER BY ts) FROM ({rows}) r "
            f"GROUP BY series_id ORDER BY series_id")


def merge(first: Samples, second: Samples) -> tuple[Samples, int]:
    """Both sets sorted by (series, time), one sample per (series, time), `first`'s where both have
    one; and how many of `second`'s were dropped as duplicates."""
    # one side empty and the other already in order (a replay's day of chunks alone): nothing to sort, and
    # sorting ~20M samples took ~9 s of CPU a day (docs/benchmarks.md, 2026-12-05)
    for alone, other in ((first, second), (second, first)):
        if not len(other) and alone.strictly_sorted():
            return alone, 0
    sid = np.concatenate([first.sid, second.sid])
    ts = np.concatenate([first.ts_us, second.ts_us])
    value = np.concatenate([first.value, second.value])
    rank = np.concatenate([np.zeros(len(first), np.int8), np.ones(len(second), np.int8)])
    order = np.lexsort((rank, ts, sid))
    sid, ts, value = sid[order], ts[order], value[order]
    keep = np.ones(len(sid), bool)
    keep[1:] = (sid[1:] != sid[:-1]) | (ts[1:] != ts[:-1])
    return Samples(sid[keep], ts[keep], value[keep]), int(len(keep) - keep.sum())


def _chunk_query(series: bool) -> str:
    # A chunk lies in one UTC day: those holding samples of [lo, hi] start on or after lo's day.
    return ("SELECT series_id, NULL::timestamptz[], NULL::float8[], data FROM sample_chunks "
            "WHERE first_ts >= %(day)s AND first_ts <= %(hi)s AND last_ts >= %(lo)s"
            + (" AND series_id = ANY(%(sids)s)" if series else ""))


def _decoded(chunks: list[tuple[int, bytes]], lo: datetime, hi: datetime) -> Samples:
    """The samples of these chunks in [lo, hi], sorted by series and time."""
    if not chunks:
        return Samples.empty()
    parts = [(sid, *decode(data)) for sid, data in chunks]
    # Concatenated in (series, first time) order, a series' chunks (disjoint, each in time order) come out
    # sorted already: checked, else sorted as they came. Sorting every sample of a day's chunks took ~19 s of
    # CPU for a replay's dense day (docs/benchmarks.md, 2026-12-05).
    by_start = sorted(range(len(parts)), key=lambda i: (parts[i][0], parts[i][1][0] if len(parts[i][1]) else 0))
    for order in (by_start, range(len(parts))):
        out = Samples(np.concatenate([np.full(len(parts[i][1]), parts[i][0], np.int64) for i in order]),
                      np.concatenate([parts[i][1] for i in order]), np.concatenate([parts[i][2] for i in order]))
        sel = (out.ts_us >= _us(lo)) & (out.ts_us <= _us(hi))
        if not sel.all():
            out = out.take(sel)
        if out.strictly_sorted():
            return out
    return out.take(np.lexsort((out.ts_us, out.sid)))


def read_chunks(cur: psycopg.Cursor[Any], lo: datetime, hi: datetime, series_ids: list[int] | None = None
                ) -> Samples:
    """The chunk samples of [lo, hi] (sorted by series and time)."""
    params = {"day": _day_floor(lo), "lo": lo, "hi": hi, "sids": series_ids}
    return _decoded(copy_rows_and_chunks(cur, _chunk_query(series_ids is not None), params)[1], lo, hi)


# Each series' newest sample before %(before)s by `last_samples` (an index probe per series: hot rows, import
# blocks, the newest chunks' tails), kept if it is in the range.
_NEWEST_SQL = ("SELECT s.sid, x.ts, x.value FROM unnest(%(sids)s::int[]) s(sid) "
               "CROSS JOIN LATERAL last_samples(s.sid, 1, %(before)s) x WHERE x.ts >= %(lo)s")


def newest_between(conn: Connection, lo: datetime, hi: datetime, series_ids: list[int]) -> dict[int, tuple[int, float]]:
    """Each series' newest sample with lo <= ts <= hi: {series id: (Unix microseconds, value)}, series without
    one left out. A probe per series, and the chunks of the range (an `hi` in compressed time): never a scan of
    every sample in the range, whatever else was stored in it."""
    raw = conn.connection.driver_connection
    newest: dict[int, tuple[int, float]] = {}
    with raw.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(_NEWEST_SQL, {"sids": series_ids, "before": hi + timedelta(microseconds=1), "lo": lo})
        for sid, ts, value in cur:
            newest[sid] = (_us(ts), value)
        chunks = read_chunks(cur, lo, hi, series_ids)
    ends = np.flatnonzero(np.r_[chunks.sid[1:] != chunks.sid[:-1], True]) if len(chunks) else ()
    for i in ends:  # each series' last chunk sample in the range (sorted by series and time)
        sid, ts_us = int(chunks.sid[i]), int(chunks.ts_us[i])
        if sid not in newest or ts_us > newest[sid][0]:
            newest[sid] = (ts_us, float(chunks.value[i]))
    return newest


# The same rows as read_samples' COPY, for a list of series. PostgreSQL planned that COPY's query on every
# call (0.3-0.7 ms, several times its execution); this SELECT is prepared and series_samples' own query is
# a generic plan, so a connection plans it once.
_SERIES_SAMPLES = "SELECT series_id, ts, value, data FROM series_samples(%(lo)s, %(hi)s, %(sids)s::int[])"


# the rows and blocks of a range as a row of arrays per 1,024 series (`parse_copy_grouped`), in no order
_GROUPED_SQL = ("SELECT array_agg(series_id), array_agg(ts), array_agg(value) FROM raw_rows_between(%(lo)s, %(hi)s) "
                "GROUP BY series_id >> 10")


def read_samples(conn: Connection | psycopg.Connection[Any], lo: datetime, hi: datetime,
                 series_ids: list[int] | None = None) -> Samples:
    """Every stored sample with lo <= ts <= hi (of these series, or all), sorted by series and time:
    hot rows, import blocks and compressed chunks, one sample per (series, time)."""
    raw = conn if isinstance(conn, psycopg.Connection) else conn.connection.driver_connection
    if series_ids is None:  # every series (a live cycle's window: a sample or a few a series): planned for this
        # range, a COPY of a row per 1,024 series (a row a series took a Python step each: ~20 % of a 72-port
        # live cycle, seconds at 20k ports), then the range's chunks
        with raw.cursor() as cur:  # type: ignore[union-attr]
            rows = parse_copy_grouped(copy_bytes(cur, _GROUPED_SQL, {"lo": lo, "hi": hi})).in_order()
            found = read_chunks(cur, lo, hi)
    else:  # some series (a /series request): a prepared statement, planned once per connection (migration 0290)
        with raw.cursor(binary=True) as cur:  # type: ignore[union-attr]
            cur.execute(_SERIES_SAMPLES, {"lo": lo, "hi": hi, "sids": series_ids}, prepare=True)
            rows, chunks = parse_result(cur.pgresult)
        rows = rows.in_order()  # each series' times are in order already (array_agg's ORDER BY)
        found = _decoded(chunks, lo, hi)
    if not len(found):
        return rows  # a block may repeat a row's time only after a re-import
    return merge(found, rows)[0]


STAGE_TABLE = "chunk_samples"


def merged_between(lo: str, hi: str, staged: int = 1) -> str:
    """SQL for (series_id, ts, value) of rows, blocks and the staged chunk samples; `lo`/`hi` are SQL
    expressions (bind parameters). Call `stage_chunks` for the same range first, in the same transaction,
    and pass what it returned: with nothing staged this is rows and blocks alone, which keeps the plan
    of the usual case (no chunk in range) as it was."""
    rows = f"raw_rows_between({lo}, {hi})"
    if not staged:
        return rows
    return (f"(SELECT series_id, ts, value FROM {rows} UNION ALL "
            f"SELECT series_id, ts, value FROM {STAGE_TABLE} WHERE ts >= {lo} AND ts <= {hi})")


def stage_chunks(conn: Connection, lo: datetime, hi: datetime, series_ids: list[int] | None = None) -> int:
    """Decode the chunks of [lo, hi] into the session's temp table `chunk_samples` (emptied first, and
    at commit); returns the samples staged."""
    raw = conn.connection.driver_connection
    with raw.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {STAGE_TABLE} (series_id int NOT NULL, ts timestamptz NOT NULL, "
                    f"value float8 NOT NULL) ON COMMIT DELETE ROWS")
        cur.execute(f"DELETE FROM {STAGE_TABLE}")  # what an earlier call in this transaction staged
        found = read_chunks(cur, lo, hi, series_ids)
        if len(found):
            with cur.copy(f"COPY {STAGE_TABLE} (series_id, ts, value) FROM STDIN (FORMAT BINARY)") as cp:
                cp.write(HEADER + pack_rows_us(found.sid, found.ts_us, found.value) + TRAILER)
            cur.execute(f"ANALYZE {STAGE_TABLE}")
    return len(found)
