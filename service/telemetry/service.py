"""Telemetry logic: Prometheus-text import and series queries (plain functions)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, TextClause, text

from service.config import get_settings
from service.observability import INGEST_ERRORS, INGESTED_ROWS
from service.telemetry import catalogue
from service.telemetry.counters import rates
from service.telemetry.ingest import Ingestor, IngestReport, NothingStored
from service.telemetry.promtext import PromParseError
from service.telemetry.readcache import ROLLUPS, Contributions, Mark, concat, read_marks
from service.telemetry.rollups import L1H, L5M, LEVELS, Level, floor_to
from service.telemetry.samples import Sample
from service.telemetry.store import read_samples


def import_prometheus(
    *,
    engine: Engine,
    chunks: Iterable[bytes],
    source: str = "body",
    default_ts_ms: int | None = None,
    batch_rows: int = 50_000,
    on_progress: Callable[[int], None] | None = None,
) -> IngestReport:
    """Import exposition text (UTF-8 bytes, in chunks of any size) in one transaction; a malformed
    line (or a timestamp not in ms) raises PromParseError and writes nothing, as do samples that are all
    refused (NothingStored, a PromParseError whose report says why). `on_progress` gets the lines read so far."""
    default_ts = default_ts_ms if default_ts_ms is not None else int(time.time() * 1000)
    try:
        with engine.begin() as conn:
            # Rows are stored while the lines are still being parsed; a PromParseError (or
            # any error) aborts that and rolls back the whole transaction.
            report = Ingestor(conn, batch_rows=batch_rows).import_exposition(chunks, source, default_ts, on_progress)
    except NothingStored:
        INGEST_ERRORS.labels(reason="nothing_stored").inc()
        raise
    except PromParseError:
        INGEST_ERRORS.labels(reason="parse").inc()
        raise
    INGESTED_ROWS.inc(report.written)
    return report


def ingest_samples(*, engine: Engine, samples: Iterable[Sample], batch_rows: int = 50_000) -> IngestReport:
    """Store canonical samples from a collector in one transaction."""
    with engine.begin() as conn:
        ingestor = Ingestor(conn, batch_rows=batch_rows)
        for s in samples:
            ingestor.add(s)
        report = ingestor.finish()
    INGESTED_ROWS.inc(report.written)
    return report


@dataclass
class SeriesResult:
    metric: str
    device: str
    port: str | None
    lane: int | None
    priority: int | None
    gpu: int | None
    kind: str
    unit: str
    points: list[tuple[int, float | None]]


_SERIES_FILTERS = {"device": "d.name = :device", "port": "p.name = :port", "lane": "s.lane = :lane",
                   "priority": "s.priority = :priority", "gpu": "s.gpu = :gpu"}


@functools.cache
def _series_sql(given: tuple[str, ...]) -> TextClause:
    """The series lookup with a condition for each given filter only. psycopg prepares a statement run often,
    and PostgreSQL then keeps one generic plan: with `(:x IS NULL OR ...)` conditions that plan could not use
    an index, so each request was planned afresh (0.1 ms of database CPU, and text() parsed the SQL again)."""
    where = "".join(f" AND {_SERIES_FILTERS[k]}" for k in given)
    return text(f"""
SELECT s.id, s.metric, d.name, p.name, s.lane, s.priority, s.gpu, s.counter_bits, s.saturating
FROM series s JOIN devices d ON d.id = s.device_id LEFT JOIN ports p ON p.id = s.port_id
WHERE s.metric = :metric{where}
ORDER BY d.name, p.name NULLS FIRST, s.lane NULLS FIRST, s.priority NULLS FIRST, s.gpu NULLS FIRST
LIMIT :limit
""")


def _per_series(conn: Connection, sids: list[int], start: datetime, end: datetime
                ) -> dict[int, tuple[list[int], list[float]]]:
    """(times in ms, values) per series in [start, end]: rows, blocks and chunks (service/telemetry/store.py)."""
    got = read_samples(conn, start, end, sids)
    cuts = np.searchsorted(got.sid, sids, side="left").tolist()
    ends = np.searchsorted(got.sid, sids, side="right").tolist()
    ts_ms, vals = got.ts_ms, got.value
    return {sid: (ts_ms[cuts[i]:ends[i]].tolist(), vals[cuts[i]:ends[i]].tolist()) for i, sid in enumerate(sids)}


def query_series(
    *,
    conn: Connection,
    metric: str,
    start: datetime,
    end: datetime,
    device: str | None = None,
    port: str | None = None,
    lane: int | None = None,
    priority: int | None = None,
    gpu: int | None = None,
    step_s: float | None = None,
    raw: bool = False,
    max_series: int = 1000,
    level_after_s: tuple[float, float] | None = None,
) -> list[SeriesResult]:
    """Stored series in [start, end]: gauges as stored, counters as per-second rates.

    With `step_s`, points are bucketed: gauges average per bucket; counter rates are the
    summed increases per bucket divided by the bucket's covered time.

    Ranges longer than `level_after_s` (5m, 1h thresholds; default from settings) are served
    from rollups, bucketed at least at the rollup's width, with the same point shape.
    """
    mdef = catalogue.get(metric)
    if mdef is None:
        raise KeyError(metric)
    is_counter = mdef.kind is catalogue.Kind.COUNTER and not raw
    filters = {"device": device, "port": port, "lane": lane, "priority": priority, "gpu": gpu}
    given = tuple(k for k, v in filters.items() if v is not None)
    found = conn.execute(_series_sql(given), {"metric": metric, "limit": max_series,
                                              **{k: filters[k] for k in given}}).all()
    level = None if raw else _pick_level(end - start, step_s, level_after_s)
    if level is not None:
        return _query_rollups(conn, level, mdef, found, start, end, step_s, is_counter)
    out = []
    points_of = _per_series(conn, sorted(r[0] for r in found), start, end)
    for sid, m, dev, prt, ln, prio, g, bits, sat in found:
        ts, vals = points_of[sid]
        if is_counter:
            per_s = rates(ts, vals, bits=bits, saturating=sat)
            points = list(zip(ts[1:], per_s[1:], strict=True))
            if step_s:
                points = _bucket_rates(ts, per_s, step_s)
        else:
            points = list(zip(ts, vals, strict=True))
            if step_s:
                points = _bucket_gauge(points, step_s)
        out.append(SeriesResult(m, dev, prt, ln, prio, g, mdef.kind.value, "1/s" if is_counter else mdef.unit,
                                points))
    return out


# How `_query_rollups` reads: the watermarks, rollup contributions per series, raw samples per series.
RollupReaders = tuple[Callable[[Connection], dict[str, Mark]],
                      Callable[[Connection, Level, Mark, list[int], datetime, datetime, bool],
                               dict[int, Contributions]],
                      Callable[[Connection, list[int], datetime, datetime], dict[int, tuple[list[int], list[float]]]]]


def _bucket_gauge(points: list[tuple[int, float]], step_s: float) -> list[tuple[int, float | None]]:
    step = int(step_s * 1000)
    sums: dict[int, list[float]] = {}
    for t, v in points:
        sums.setdefault(t - t % step, []).append(v)
    return [(b, sum(v) / len(v)) for b, v in sorted(sums.items())]


def _bucket_rates(ts: list[int], per_s: list[float | None], step_s: float) -> list[tuple[int, float | None]]:
    step = int(step_s * 1000)
    inc: dict[int, float] = {}
    covered: dict[int, int] = {}
    for i in range(1, len(ts)):
        r = per_s[i]
        if r is None:
            continue
        b = ts[i] - ts[i] % step
        dt = ts[i] - ts[i - 1]
        inc[b] = inc.get(b, 0.0) + r * dt / 1000.0
        covered[b] = covered.get(b, 0) + dt
    return [(b, inc[b] * 1000.0 / covered[b]) for b in sorted(inc)]


def _pick_level(span: timedelta, step_s: float | None, after_s: tuple[float, float] | None) -> Level | None:
    """Raw for short ranges, 5m rollups for medium, 1h for long; never coarser than a requested step."""
    if after_s is None:
        settings = get_settings()
        after_s = (settings.series_5m_after_s, settings.series_1h_after_s)
    secs = span.total_seconds()
    level = L1H if secs > after_s[1] else L5M if secs > after_s[0] else None
    while level is not None and step_s is not None and step_s < level.bucket_s:
        level = L5M if level is L1H else None
    return level


def _query_rollups(conn: Connection, level: Level, mdef: catalogue.MetricDef, found: list[Any], start: datetime,
                   end: datetime, step_s: float | None, is_counter: bool, *,
                   readers: RollupReaders | None = None) -> list[SeriesResult]:
    """Series from the coarsest rollups that cover the range, then finer ones, then raw after the watermarks.

    Each source contributes (increase, covered ms) per counter bucket or (sum, n) per gauge bucket;
    they add up because every source attributes a counter step to the bucket where it ends. Rollup rows
    come through the per-process cache of rows before the watermarks (service/telemetry/readcache.py),
    or from `readers` (the fleet read across shards, service/shards/fleet.py), which then key the series
    by the first column of `found`.
    """
    read_marks_, contributions, per_series = readers or (read_marks, ROLLUPS.contributions, _per_series)
    max_gap_s = get_settings().rollup_max_gap_s
    # The step is a whole number of rollup buckets so that rollup rows fold exactly.
    width = level.bucket_s
    step_ms = int(max(width, -(-(step_s or width) // width) * width) * 1000)
    sids = [r[0] for r in found]
    parts: dict[int, list[Contributions]] = {sid: [] for sid in sids}
    lo = floor_to(start, width)
    marks = read_marks_(conn) if sids else {}
    for lv in reversed(LEVELS[:LEVELS.index(level) + 1]):  # coarsest first
        mark = marks.get(lv.name)
        wm = mark.done_until if mark is not None else None
        if mark is not None and lo < min(mark.done_until, end):
            for sid, c in contributions(conn, lv, mark, sids, lo, min(mark.done_until, end), is_counter).items():
                parts[sid].append(c)
        if wm is not None:
            lo = max(lo, wm)  # every bucket before wm came from rollups (wm is bucket-aligned)
    # After the finest watermark: raw samples, from one step before it so its first step counts.
    tail: dict[int, tuple[list[int], list[float]]] = {sid: ([], []) for sid in sids}
    if lo <= end and sids:
        tail = per_series(conn, sorted(sids), lo - timedelta(seconds=max_gap_s), end)
    lo_ms = int(lo.timestamp() * 1000)
    out = []
    for sid, m, dev, prt, ln, prio, g, bits, sat in found:
        cells, sums, weights = _fold(concat(parts[sid]) if parts[sid] else Contributions.empty(), step_ms)
        acc: dict[int, list[float]] = {}
        if cells:  # the tail adds into the last rollup cell (when a step spans the watermark), then after it
            acc[cells[-1]] = [sums[-1], weights[-1]]

        def add(t_ms: int, a: float, b: float, acc: dict[int, list[float]] = acc) -> None:
            cell = acc.setdefault(t_ms - t_ms % step_ms, [0.0, 0.0])
            cell[0] += a
            cell[1] += b

        ts, vals = tail[sid]
        if is_counter:
            per_s = rates(ts, vals, bits=bits, saturating=sat, max_gap_ms=int(max_gap_s * 1000))
            for i in range(1, len(ts)):
                r = per_s[i]
                if r is not None and ts[i] >= lo_ms:
                    dt = ts[i] - ts[i - 1]
                    add(ts[i], r * dt / 1000.0, dt)
        else:
            for t, v in zip(ts, vals, strict=True):
                if t >= lo_ms:
                    add(t, v, 1.0)
        if cells:
            sums[-1], weights[-1] = acc.pop(cells[-1])
        scale = 1000.0 if is_counter else 1.0
        points: list[tuple[int, float | None]] = [(b, a * scale / c) for b, a, c in zip(cells, sums, weights,
                                                                                         strict=True) if c]
        points += [(b, a * scale / c) for b, (a, c) in sorted(acc.items()) if c]
        out.append(SeriesResult(m, dev, prt, ln, prio, g, mdef.kind.value, "1/s" if is_counter else mdef.unit,
                                points))
    return out


def _fold(c: Contributions, step_ms: int) -> tuple[list[int], list[float], list[float]]:
    """Cells (step starts, ascending) with each cell's sum and weight: added in bucket order, as one
    addition after another (the same floats whichever way the rows came)."""
    cell = c.t - c.t % step_ms
    if len(cell) < 2 or bool((cell[1:] != cell[:-1]).all()):  # one bucket per cell: nothing to add
        return cell.tolist(), (c.a + 0.0).tolist(), (c.b + 0.0).tolist()  # 0.0 + -0.0 is 0.0, as in a sum
    cells: list[int] = []
    sums: list[float] = []
    weights: list[float] = []
    for t, a, b in zip(cell.tolist(), c.a.tolist(), c.b.tolist(), strict=True):
        if cells and cells[-1] == t:
            sums[-1] += a
            weights[-1] += b
        else:
            cells.append(t)
            sums.append(0.0 + a)
            weights.append(0.0 + b)
    return cells, sums, weights
