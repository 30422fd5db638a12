"""Marks for the rollups: the hours a writer stored samples in behind the rollup watermark.

The rollup task computes each level forward from its watermark and never rescans history
(service/telemetry/rollups.py), so samples stored before the watermark (an import of history, a late
sample, `sim generate --store`) would be in no rollup. Their writer marks those hours in
`rollup_backfill` inside its own transaction: the samples and the marks commit together or not at all,
and the rollup task computes the marked hours again, oldest first, each mark deleted by the transaction
that computed its hour (a row per writer and hour: the run deletes the rows it read before computing,
and a mark made meanwhile stays for the next round). No SQLAlchemy here: `fabricwatch import` runs without it.

Each hour after one written is marked too: its first step (from the last sample before it) may now
start at a sample just written. An hour at or after the 5-minute watermark needs no mark (the watermark
reaches it later and reads what is stored then), except before the task's first run: it starts at the
oldest day of `sample_rows`, so history written only as blocks or chunks (`with_blocks`) is marked then.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg

HOUR_MS = 3_600_000

# Rows of this writer's own (a log, no unique key): writers of late samples never wait for each other.
# An hour is marked when what was written in it (from `lo`) lies behind the 5-minute watermark.
_MARK_SQL = """
INSERT INTO rollup_backfill (level, hour, lo)
SELECT '5m', h, lo FROM unnest(%(hours)s::timestamptz[], %(los)s::timestamptz[]) AS m(h, lo)
WHERE lo < coalesce((SELECT done_until FROM rollup_watermarks WHERE level = '5m'),
                    CASE WHEN %(unrolled)s THEN 'infinity'::timestamptz ELSE '-infinity'::timestamptz END)
"""


class Hours:
    """The UTC hours (ms since 1970 // 1 h) of the samples a writer stored, each with its earliest time."""

    def __init__(self) -> None:
        self.first: dict[int, int] = {}  # hour -> earliest ms written in it

    @property
    def hours(self) -> set[int]:
        return set(self.first)

    def add_times(self, ts_ms: np.ndarray) -> None:
        """The hours of these times: of a batch spanning up to two days, every hour between its first and
        last (a gap over-marked at worst, at no sort's cost: only the first hour starts after its start),
        else each time's hour, whole."""
        if not len(ts_ms):
            return
        t0 = int(ts_ms.min())
        lo, hi = t0 // HOUR_MS, int(ts_ms.max()) // HOUR_MS
        hours = range(lo, hi + 1) if hi - lo <= 48 else np.unique(ts_ms // HOUR_MS).tolist()
        for h in hours:
            start = t0 if h == lo else h * HOUR_MS
            self.first[h] = min(self.first.get(h, start), start)

    def mark(self, cur: psycopg.Cursor[Any], *, with_blocks: bool) -> int:
        """Mark the hours behind the 5-minute watermark (see the module's doc); the marks written."""
        if not self.first:
            return 0
        # the hour after each, from its start: its first step may begin at a sample written here
        wanted = {h + 1: (h + 1) * HOUR_MS for h in self.first} | self.first
        for h in self.first:
            wanted[h] = min(wanted[h], self.first[h])
        hours = sorted(wanted)
        return cur.execute(_MARK_SQL, {"hours": [datetime.fromtimestamp(h * 3600, UTC) for h in hours],
                                       "los": [datetime.fromtimestamp(wanted[h] / 1000, UTC) for h in hours],
                                       "unrolled": with_blocks}).rowcount
