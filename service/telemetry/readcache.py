"""Rollup rows for `/api/v1/series`, cached per process: rows before a level's watermark do not change.

A rollup level computes its buckets forward from its watermark (service/telemetry/rollups.py): the rows
before `rollup_watermarks.done_until` are final, except when something rewrites them, and every way
that happens moves what a request reads first (`read_marks`, one query for both levels):

- a back-fill (history imported or late samples behind the watermark) rewrites rows and sets the level's
  `revised_at` in the same transaction;
- retention drops partitions, a TRUNCATE (a reset, the tests) or a restore gives them new storage: the
  partitions' relfilenodes are part of the mark;
- a watermark moved back (a rebuild) is seen as one lower than what an entry covers.

An entry holds one series' contributions (bucket start, then sum and weight: increase and covered ms
for counters, avg * n and n for gauges) for a range of buckets [lo, hi) with hi at or before the
watermark it was read under, and the mark it was read under. A request uses an entry only under the
same mark, reads the buckets it lacks (the buckets the watermark passed since: a short range), and
puts the merged entry back. The mark is read before the rows, in an earlier statement: rows can only be
newer than their mark, never older, so a rewrite that commits in between is seen by the next request.

Profiled before this (bench/load.py, docs/benchmarks.md): reading 864 five-minute rows of a 3-day
range was about half of a rolled-up `/series` request's CPU, API and database together.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from cachetools import LRUCache
from sqlalchemy import Connection, text

from service.telemetry.rollups import EPOCH, Level

MAX_BYTES = 64 * 1024 * 1024  # per process: ~35 KB per series for 3 days of 5-minute rows

# One row per level: its watermark, when rows before it were last rewritten, and the storage of its
# partitions (a drop, a TRUNCATE or a restore changes that set).
_MARKS_SQL = """
SELECT w.level, w.done_until, w.revised_at,
       (SELECT array_agg(c.relfilenode::int8 ORDER BY c.relfilenode) FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass('rollup_' || w.level))
FROM rollup_watermarks w
"""


@dataclass(frozen=True, slots=True)
class Mark:
    done_until: datetime
    stamp: tuple[object, ...]  # revised_at and the partitions' relfilenodes


def read_marks(conn: Connection) -> dict[str, Mark]:
    """Each level's watermark and what validates cached rows before it; a level without one is absent."""
    out = {}
    for level, done, revised, files in conn.execute(text(_MARKS_SQL)):
        if done is not None:
            out[level] = Mark(done, (revised, tuple(files or ())))
    return out


@dataclass(frozen=True, slots=True)
class Contributions:
    """Bucket start (ms), sum and weight per bucket, in bucket order."""

    t: np.ndarray
    a: np.ndarray
    b: np.ndarray

    @staticmethod
    def empty() -> Contributions:
        return Contributions(np.empty(0, np.int64), np.empty(0), np.empty(0))

    def between(self, lo_ms: int, hi_ms: int) -> Contributions:
        i, j = np.searchsorted(self.t, [lo_ms, hi_ms], side="left").tolist()
        return Contributions(self.t[i:j], self.a[i:j], self.b[i:j])

    @property
    def nbytes(self) -> int:
        return self.t.nbytes + self.a.nbytes + self.b.nbytes + 200


def concat(parts: list[Contributions]) -> Contributions:
    if len(parts) == 1:
        return parts[0]
    return Contributions(np.concatenate([p.t for p in parts]), np.concatenate([p.a for p in parts]),
                         np.concatenate([p.b for p in parts]))


@dataclass(frozen=True, slots=True)
class _Entry:
    stamp: tuple[object, ...]
    lo_ms: int
    hi_ms: int
    rows: Contributions


_ROWS_SQL = ("SELECT series_id, (extract(epoch FROM bucket) * 1000)::bigint, n, avg, increase, covered_s "
             "FROM {table} WHERE series_id = ANY(:sids) AND bucket >= :lo AND bucket < :hi "
             "ORDER BY series_id, bucket")


_MS = timedelta(milliseconds=1)


def _ms(t: datetime) -> int:
    """Unix ms, rounded up: buckets start on whole seconds, so `bucket < t` is `bucket_ms < _ms(t)`."""
    return -((EPOCH - t) // _MS)


def _dt(ms: int) -> datetime:
    return EPOCH + ms * _MS


def _read(conn: Connection, level: Level, sids: list[int], lo: datetime, hi: datetime,
          is_counter: bool) -> dict[int, Contributions]:
    """Each series' contributions for buckets in [lo, hi); a bucket that adds nothing is left out."""
    rows = conn.execute(text(_ROWS_SQL.format(table=level.table)), {"sids": sids, "lo": lo, "hi": hi}).all()
    return from_rows(rows, sids, is_counter)


def from_rows(rows: Sequence[Any], sids: list[int], is_counter: bool) -> dict[int, Contributions]:
    """Contributions per series of rollup rows (series_id, bucket_ms, n, avg, increase, covered_s), sorted by
    series and bucket; a bucket that adds nothing is left out."""
    out = dict.fromkeys(sids, Contributions.empty())
    if not rows:
        return out
    sid = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    t = np.fromiter((r[1] for r in rows), np.int64, len(rows))
    if is_counter:
        inc = np.array([r[4] for r in rows], dtype=float)  # None -> nan
        cov = np.array([r[5] for r in rows], dtype=float)
        keep = ~np.isnan(inc) & ~np.isnan(cov) & (cov != 0)
        sid, t, a, b = sid[keep], t[keep], inc[keep], cov[keep] * 1000.0
    else:
        n = np.fromiter((r[2] for r in rows), float, len(rows))
        avg = np.fromiter((r[3] for r in rows), float, len(rows))
        a, b = avg * n, n
    cuts = np.searchsorted(sid, sids, side="left").tolist()
    ends = np.searchsorted(sid, sids, side="right").tolist()
    for k, s in enumerate(sids):
        out[s] = Contributions(t[cuts[k]:ends[k]], a[cuts[k]:ends[k]], b[cuts[k]:ends[k]])
    return out


class RollupCache:
    """Entries per (level, series, counter or gauge), least recently used out first, bounded in bytes.
    Thread-safe: sync routes run in a thread pool."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._entries: LRUCache[tuple[str, int, bool], _Entry] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda e: e.rows.nbytes)
        self.reads = 0  # statements that read rollup rows (the tests count them)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def contributions(self, conn: Connection, level: Level, mark: Mark, sids: list[int], lo: datetime,
                      hi: datetime, is_counter: bool) -> dict[int, Contributions]:
        """Each series' contributions for buckets in [lo, hi), hi at or before `mark.done_until`, read
        under `mark` (read_marks, before this call)."""
        lo_ms, hi_ms = _ms(lo), _ms(hi)
        if lo_ms >= hi_ms or not sids:
            return dict.fromkeys(sids, Contributions.empty())
        wm_ms = _ms(mark.done_until)
        with self._lock:
            have = {s: self._entries.get((level.name, s, is_counter)) for s in sids}
        # Usable: read under this mark, and still before the watermark (one moved back is a rebuild).
        have = {s: e for s, e in have.items() if e is not None and e.stamp == mark.stamp and e.hi_ms <= wm_ms}
        # What is missing, per range (the series of one request usually share their entries' bounds).
        wanted: dict[tuple[int, int], list[int]] = {}
        for s in sids:
            e = have.get(s)
            if e is None or e.lo_ms > hi_ms or e.hi_ms < lo_ms:
                have.pop(s, None)
                wanted.setdefault((lo_ms, hi_ms), []).append(s)  # no entry, or one that does not touch
                continue
            if lo_ms < e.lo_ms:
                wanted.setdefault((lo_ms, e.lo_ms), []).append(s)
            if hi_ms > e.hi_ms:
                wanted.setdefault((e.hi_ms, hi_ms), []).append(s)
        got: dict[int, list[tuple[int, int, Contributions]]] = {}
        for (a, b), group in wanted.items():
            self.reads += 1
            for s, c in _read(conn, level, group, _dt(a), _dt(b), is_counter).items():
                got.setdefault(s, []).append((a, b, c))
        out: dict[int, Contributions] = {}
        put: dict[int, _Entry] = {}
        for s in sids:
            e = have.get(s)
            pieces = sorted(got.get(s, []), key=lambda p: p[0])
            if e is not None:
                pieces = sorted([*pieces, (e.lo_ms, e.hi_ms, e.rows)], key=lambda p: p[0])
            if pieces and (e is None or len(pieces) > 1):
                merged = _Entry(mark.stamp, pieces[0][0], pieces[-1][1], concat([p[2] for p in pieces]))
                # Keep an entry to about what is asked: a window sliding forward drops its old end.
                if merged.lo_ms < lo_ms - (hi_ms - lo_ms):
                    merged = _Entry(mark.stamp, lo_ms, merged.hi_ms, merged.rows.between(lo_ms, merged.hi_ms))
                put[s] = e = merged
            assert e is not None
            out[s] = e.rows.between(lo_ms, hi_ms)
        if put:
            with self._lock:
                for s, e in put.items():
                    if e.rows.nbytes <= self._entries.maxsize:
                        self._entries[(level.name, s, is_counter)] = e
        return out


ROLLUPS = RollupCache()
