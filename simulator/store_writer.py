"""A scenario's telemetry straight into the store, in the compressed layout (issue #22 item 4).

Month-scale history as Prometheus text is terabytes; as chunks (service/telemetry/chunk_codec.py) it
is a few bytes a sample. `generate_into_store` steps the same simulation as the text writer and:

- loads the scenario's inventory (`upsert_inventory`, as `fabricwatch inventory load`; nothing is
  pruned) and creates the series through the ingest path's resolver (`ingest.resolve_series`);
- keeps each value as the text path prints it (`%d`, `%.6g`, `%.6f`) and drops what an import
  drops (missing and non-finite readings), so the store holds the same samples as
  `sim generate` + `fabricwatch import` would;
- buffers a span of steps as a (series x steps) matrix per metric block (bounded by `memory_bytes`,
  cut at UTC days so a series' day is usually one chunk), then hands it to `compress.write_chunks`
  a batch of series at a time: one chunk per series and UTC day, merged with any stored chunk it
  overlaps (a sample stored before keeps its reading, as an import's ON CONFLICT DO NOTHING does);
- samples inside the hot window (from the last whole hour before `now - hot window`, the
  compression task's cutoff) go to `sample_rows` instead, as ingest would leave them: the
  compression task moves them later, and no sample is in both;
- marks the hours it wrote for the rollup task (service/telemetry/backfill.py), which computes their
  5-minute and 1-hour rollups: its forward run never reads chunks.

Everything is one transaction: a bad input or an interrupted run writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry.backfill import Hours
from service.telemetry.catalogue import METRICS, Entity, Kind
from service.telemetry.chunk_codec import encode
from service.telemetry.compress import CompressRun, analyze_and_summarize, write_chunks
from service.telemetry.copy_format import HEADER, TRAILER, pack_rows
from service.telemetry.ingest import SeriesKey, resolve_series
from service.telemetry.partitions import chunk_partition_name, create_partitions
from service.telemetry.store import Samples, merge
from simulator.generate import BlockText, resolve_range, write_frame
from simulator.scenarios import Scenario, TimeSpec, load_scenario
from simulator.telemetry import PRIORITY, Block, FabricSim, Frame, make_sim, resolve_inventory, timeline

_DAY_S = 86_400
_HOUR_S = 3600
_PREFIX_STEPS = 60  # simulated before the estimate (and kept): what the bytes per sample are measured on
_SAMPLE_SERIES = 400  # series encoded for the estimate
_BATCH_SAMPLES = 1 << 21  # samples handed to write_chunks at a time (~50 MB with its copies)
_WRITE_BPS = 20e6  # what PostgreSQL takes in chunks a second on the 2-core machine (docs/benchmarks.md)


@dataclass(frozen=True)
class StoreEstimate:
    """What a run will store, from its first steps (simulated before anything is written)."""

    steps: int
    samples: int
    series: int
    chunks: int
    disk_bytes: int        # chunks and rows on disk, table + TOAST + indexes, about
    bytes_per_sample: float
    seconds: float         # wall time, about (simulation and encoding, measured on the first steps)
    text_bytes: int        # what `sim generate` would write as text, for comparison
    hot_from: datetime     # samples from here on go to rows (the hot window)


@dataclass
class StoreResult:
    steps: int
    samples: int           # stored (chunks + rows)
    chunk_samples: int
    row_samples: int
    series: int
    chunks: int
    ports: int
    faults: int
    seconds: float
    disk_bytes: int        # growth of sample_chunks and sample_rows, table + TOAST + indexes
    duplicates: int        # samples dropped as already stored
    days: list[date] = field(default_factory=list)


class StoreError(Exception):
    """The store cannot take this run (no schema, unknown series); nothing was written."""


class StoreDeclined(Exception):
    """The caller's `confirm` declined the estimate; nothing was written."""


def _round_as_text(metric: str, values: np.ndarray) -> np.ndarray:
    """The values as `sim generate` prints them and an import reads them back (NaN where none)."""
    kind = METRICS[metric].kind
    if kind is Kind.COUNTER and not metric.endswith("_seconds_total"):
        if values.dtype == np.uint64:
            return values.astype(np.int64).astype(np.float64)
        out = np.full(len(values), np.nan)
        ok = np.isfinite(values)
        out[ok] = values[ok].astype(np.int64).astype(np.float64)
        return out
    fmt = "%.6f " if metric.endswith("_seconds_total") else "%.6g "
    vals = np.asarray(values, np.float64)
    # the same C formatting as the text writer, parsed back as an import parses it (correctly rounded)
    return np.fromstring((fmt * len(vals)) % tuple(vals.tolist()), sep=" ")


def _series_keys(b: Block, sim: FabricSim) -> list[SeriesKey]:
    m = sim.m
    if b.gpu is not None:
        return [(b.metric, m.dev_names[d], None, None, None, g)
                for d, g in zip(b.gpu_dev.tolist(), b.gpu.tolist(), strict=True)]
    ent = METRICS[b.metric].entity
    lanes = b.lane.tolist() if ent is Entity.LANE and b.lane is not None else [None] * len(b.ports)
    prio = PRIORITY if ent is Entity.PRIORITY else None
    return [(b.metric, m.port_dev_name[p], m.port_name[p], lane, prio, None)
            for p, lane in zip(b.ports.tolist(), lanes, strict=True)]


def _block_dev(b: Block, sim: FabricSim) -> np.ndarray:
    return b.gpu_dev if b.gpu is not None else sim.m.dev[b.ports]


class _Buffer:
    """A span of steps: per block a (series x steps) value matrix (NaN: no sample), per device the times."""

    def __init__(self, sim: FabricSim, cap: int) -> None:
        self.cap = cap
        self.vals = {b.metric: np.full((len(b.ports), cap), np.nan) for b in sim.blocks}
        self.ts_ms = np.zeros((len(sim.m.dev_names), cap), np.int64)
        self.t: list[float] = []  # step times of the columns
        self.n = 0

    def add(self, frame: Frame) -> None:
        k = self.n
        self.t.append(frame.t)
        self.ts_ms[:, k] = frame.ts_ms
        for metric, mat in self.vals.items():
            v = frame.values.get(metric)
            if v is None:
                mat[:, k] = np.nan
                continue
            v = np.asarray(v, dtype=float) if v.dtype != np.uint64 else v  # as write_frame passes it
            col = _round_as_text(metric, v)
            keep = frame.keep.get(metric)
            if keep is not None:
                col[~keep] = np.nan
            mat[:, k] = col
        self.n += 1

    def count(self) -> int:
        return int(sum(np.isfinite(m[:, :self.n]).sum() for m in self.vals.values()))


@dataclass
class _Target:
    """Where one block's series go: ids and each series' device (for its times)."""

    sids: np.ndarray
    dev: np.ndarray


def _hot_from(now: datetime, hot_s: float) -> datetime:
    """The compression task's cutoff: the last whole hour before now - hot window."""
    t = int((now - timedelta(seconds=hot_s)).timestamp()) // _HOUR_S * _HOUR_S
    return datetime.fromtimestamp(t, UTC)


def _chunk_disk_bytes(data: np.ndarray) -> np.ndarray:
    """On-disk bytes of chunks with `data` bytes of codec output: the heap row (~110 B) and its primary-key
    entry (~40 B); data past ~2 kB goes to TOAST in 1,996-byte pieces, at most 4 a page, so each piece
    costs a quarter page (2,048 B) plus its TOAST index entry."""
    toasted = data > 2000
    pieces = np.ceil(data / 1996)
    return np.where(toasted, 150 + pieces * (2048 + 20), 150 + data)


def _estimate(buf: _Buffer, targets: dict[str, _Target], times: list[float], step_s: float, hot_from: datetime,
              step_seconds: float, text_bytes_per_step: int, cap: int) -> StoreEstimate:
    """Extrapolate the first steps: samples a step, and the codec's bytes and time measured by encoding a
    spread of series over them, as f(n) = head + n * per-sample (from each series' first half and whole)."""
    n, steps = buf.n, len(times)
    per_step = buf.count() / max(n, 1)
    samples = int(per_step * steps)
    series = sum(len(t.sids) for t in targets.values())
    rows_all = [(metric, i) for metric, t in targets.items() for i in range(len(t.sids))]
    pick = np.linspace(0, len(rows_all) - 1, min(_SAMPLE_SERIES, len(rows_all))).astype(int) if rows_all else []
    size = np.zeros(2)
    secs = np.zeros(2)
    count = np.zeros(2)
    used = 0
    for j in pick:
        metric, i = rows_all[j]
        v = buf.vals[metric][i, :n]
        ts = buf.ts_ms[targets[metric].dev[i], :n] * 1000
        ok = np.isfinite(v)
        if ok.sum() < 4:
            continue
        v, ts = v[ok], ts[ok]
        for k, m in enumerate((len(v) // 2, len(v))):
            clock = time.perf_counter()
            size[k] += len(encode(ts[:m], v[:m]))
            secs[k] += time.perf_counter() - clock
            count[k] += m
        used += 1
    if used:
        per_sample = max((size[1] - size[0]) / max(count[1] - count[0], 1), 0.1)
        head = max((size[0] - per_sample * count[0]) / used, 24.0)
        s_sample = max((secs[1] - secs[0]) / max(count[1] - count[0], 1), 0.0)
        s_head = max((secs[0] - s_sample * count[0]) / used, 0.0)
    else:
        per_sample, head, s_sample, s_head = 2.0, 24.0, 1e-7, 1e-4
    # a chunk per series and flushed span: UTC days of the steps, cut at `cap` steps
    t = np.asarray(times)
    hot = t >= hot_from.timestamp()
    _, per_day = np.unique(t[~hot] // _DAY_S, return_counts=True)
    spans = np.array([c / k for c in per_day.tolist() for k in [-(-c // cap)] for _ in range(k)])
    data = head + spans * per_step / max(series, 1) * per_sample
    chunks = series * len(spans)
    hot_samples = int(per_step * hot.sum())
    disk = float(series * _chunk_disk_bytes(data).sum()) + hot_samples * 100  # a row: ~100 B with its key
    seconds = steps * step_seconds + chunks * s_head + (samples - hot_samples) * s_sample + disk / _WRITE_BPS
    return StoreEstimate(steps, samples, series, chunks, int(disk), disk / max(samples, 1), float(seconds),
                         text_bytes_per_step * steps, hot_from)


def _disk_bytes(cur: psycopg.Cursor[Any]) -> int:
    """sample_chunks and sample_rows with their partitions, TOAST and indexes."""
    return int(cur.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_inherits i "
        "ON i.inhrelid = c.oid WHERE i.inhparent IN ('sample_chunks'::regclass, 'sample_rows'::regclass)"
    ).fetchone()[0])


def _check_schema(cur: psycopg.Cursor[Any]) -> None:
    missing = [t for t in ("sample_chunks", "sample_rows", "series", "devices")
               if cur.execute("SELECT to_regclass(%s) IS NULL", [t]).fetchone()[0]]
    if missing:
        raise StoreError(f"the database has no {', '.join(missing)} table: run `fabricwatch db upgrade` first")


def _text_bytes_per_step(sim: FabricSim, frame: Frame) -> int:
    """What the text writer would write for this step."""

    class _Count:
        size = 0

        def write(self, s: str) -> int:
            self.size += len(s)
            return len(s)

    out = _Count()
    write_frame(sim, {b.metric: BlockText(b, sim.m) for b in sim.blocks}, frame, out)  # type: ignore[arg-type]
    return out.size


def generate_into_store(engine: Engine, scenario_file: str | Path | Scenario, start: TimeSpec | None = None,
                        end: TimeSpec | None = None, step: TimeSpec | None = None, *,
                        groups: set[str] | None = None, now: datetime | None = None, hot_s: float = 3600.0,
                        memory_bytes: int = 1 << 30,
                        confirm: Callable[[StoreEstimate], bool] | None = None,
                        progress: Callable[[int, int], None] | None = None) -> StoreResult:
    """Simulate the scenario and store its samples as chunks (rows in the hot window), in one transaction.

    `confirm` sees the estimate before anything is written (False: StoreDeclined); `progress` gets
    (steps done, samples stored) as the run goes."""
    sc = scenario_file if isinstance(scenario_file, Scenario) else load_scenario(scenario_file)
    t0, t1, dt = resolve_range(sc, start, end, step)
    inv_dict = resolve_inventory(sc.inventory_source())
    grp = groups or (set(sc.groups) if sc.groups else None)
    sim = make_sim(inv_dict, sc, t0, groups=grp)
    inventory = Inventory.model_validate(inv_dict)
    now = now or datetime.now(UTC)
    hot_from = _hot_from(now, hot_s)
    hot_ms = int(hot_from.timestamp() * 1000)
    times = list(timeline(t0, t1, dt))
    if not times:
        raise ValueError(f"the range holds no step: it is shorter than the step ({dt:g} s)")
    series_total = sum(len(b.ports) for b in sim.blocks)
    cap = max(2, min(len(times), int(memory_bytes // max(8 * series_total, 1)), int(np.ceil(_DAY_S / dt)) + 1))
    clock = time.perf_counter()

    with engine.connect() as conn:
        conn.begin()  # the inventory's session joins this transaction (it would roll back one of its own)
        raw: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        with raw.cursor() as cur:
            _check_schema(cur)
            disk_before = _disk_bytes(cur)
        with Session(bind=conn) as session:
            upsert_inventory(session=session, inventory=inventory)
            session.flush()
        targets: dict[str, _Target] = {}
        for b in sim.blocks:
            keys = _series_keys(b, sim)
            sids, why = resolve_series(raw, keys)
            if why:
                i, reason = next(iter(why.items()))
                raise StoreError(f"{len(why)} series cannot be stored, e.g. {keys[i][0]}: {reason}")
            targets[b.metric] = _Target(sids, _block_dev(b, sim))

        buf = _Buffer(sim, cap)
        first = sim.step(times[0], dt)
        text_step = _text_bytes_per_step(sim, first)
        buf.add(first)
        done = 1
        prefix = min(len(times), _PREFIX_STEPS)
        sim_clock = time.perf_counter()
        while done < prefix and buf.n < cap and _same_day(times[0], times[done]):
            buf.add(sim.step(times[done], dt))
            done += 1
        step_seconds = (time.perf_counter() - sim_clock) / max(done - 1, 1)
        estimate = _estimate(buf, targets, times, dt, hot_from, step_seconds, text_step, cap)
        spent = time.perf_counter() - clock
        if confirm is not None and not confirm(estimate):
            conn.rollback()
            raise StoreDeclined(f"declined: about {estimate.disk_bytes:,} bytes on disk")
        clock = time.perf_counter() - spent  # the time to confirm is not the generator's

        run = CompressRun()
        writer = _Writer(raw, targets, hot_ms, run)
        if progress:
            progress(done, 0)
        while True:
            if buf.n >= 2 and not _same_day(buf.t[-2], buf.t[-1]):
                # the step just added opened a UTC day: the day before is complete (its samples in that
                # step too, with jitter), the rest of the step waits for the new day's chunks
                writer.flush(buf, cut_ms=int(buf.t[-1] // _DAY_S * _DAY_S * 1000))
                if progress:
                    progress(done, writer.stored)
            if done == len(times) or buf.n == cap:
                writer.flush(buf)
                if progress:
                    progress(done, writer.stored)
                if done == len(times):
                    break
            buf.add(sim.step(times[done], dt))
            done += 1
        writer.finish()
        conn.commit()
        with conn.begin(), raw.cursor() as cur:
            disk_after = _disk_bytes(cur)
    _analyze(engine, sorted(writer.days))
    return StoreResult(len(times), writer.stored, writer.chunk_samples, writer.row_samples, series_total,
                       run.chunks, sim.m.P, len(sc.faults), time.perf_counter() - clock,
                       disk_after - disk_before, run.duplicates + writer.row_duplicates, sorted(writer.days))


def _same_day(a: float, b: float) -> bool:
    """Whether two step times lie in one UTC day (a sample's chunk is the day of its time)."""
    return int(a // _DAY_S) == int(b // _DAY_S)


class _Writer:
    """Flushes buffered spans: chunks through compress.write_chunks, hot-window samples as rows."""

    def __init__(self, raw: psycopg.Connection[Any], targets: dict[str, _Target], hot_ms: int,
                 run: CompressRun) -> None:
        self.raw, self.targets, self.hot_ms, self.run = raw, targets, hot_ms, run
        self.stored = self.chunk_samples = self.row_samples = self.row_duplicates = 0
        self.row_days: set[int] = set()  # UTC days (since 1970) of the hot-window samples staged
        self.days: set[date] = set()
        self.hours = Hours()  # of everything stored: marked for the rollups at `finish`

    def flush(self, buf: _Buffer, cut_ms: int | None = None) -> None:
        """Store the buffered steps and empty the buffer; with `cut_ms`, the last step's samples from that
        time on stay (the first column)."""
        n = buf.n
        if not n:
            return
        kept: dict[str, np.ndarray] = {}
        if cut_ms is not None:
            late = buf.ts_ms[:, n - 1] >= cut_ms  # per device
            for metric, mat in buf.vals.items():
                rows = late[self.targets[metric].dev]
                kept[metric] = np.where(rows, mat[:, n - 1], np.nan)
                mat[rows, n - 1] = np.nan
        ts_ms = buf.ts_ms[:, :n].copy()
        buf_t_last = buf.t[-1]
        ordered = bool((np.diff(ts_ms, axis=1) > 0).all())  # else sort and keep each time's first sample
        with self.raw.cursor() as cur:
            for metric, mat in buf.vals.items():
                t = self.targets[metric]
                per = max(1, _BATCH_SAMPLES // n)
                for a in range(0, len(t.sids), per):
                    vals = mat[a:a + per, :n]
                    ok = np.isfinite(vals)
                    if not ok.any():
                        continue
                    ts = ts_ms[t.dev[a:a + per]]
                    sid = np.broadcast_to(t.sids[a:a + per, None], vals.shape)
                    s = Samples(sid[ok].astype(np.int64), ts[ok].astype(np.int64) * 1000, vals[ok])
                    self.hours.add_times(s.ts_us // 1000)
                    if not ordered:
                        s, dups = merge(Samples.empty(), s)
                        self.run.duplicates += dups
                    hot = s.ts_us >= self.hot_ms * 1000
                    if hot.any():
                        self._stage_rows(cur, s.sid[hot], s.ts_us[hot] // 1000, s.value[hot])
                        self.row_samples += int(hot.sum())
                        s = s.take(np.flatnonzero(~hot))
                    if len(s):
                        before = self.run.duplicates
                        write_chunks(cur, s, self.run)
                        self.chunk_samples += len(s) - (self.run.duplicates - before)
                        self.days.update(datetime.fromtimestamp(int(x) * _DAY_S, UTC).date()
                                         for x in np.unique(s.ts_us // (_DAY_S * 1_000_000)).tolist())
        self.stored = self.chunk_samples + self.row_samples
        for mat in buf.vals.values():
            mat.fill(np.nan)
        buf.n, buf.t = 0, []
        if kept:
            buf.ts_ms[:, 0] = ts_ms[:, n - 1]
            for metric, col in kept.items():
                buf.vals[metric][:, 0] = col
            buf.n, buf.t = 1, [buf_t_last]

    def _stage_rows(self, cur: psycopg.Cursor[Any], sid: np.ndarray, ts_ms: np.ndarray, value: np.ndarray) -> None:
        """Hot-window samples wait in a temp table (not in memory: an hour of a large fabric is GBs)."""
        if not self.row_days:
            cur.execute("CREATE TEMP TABLE sim_rows_stage (series_id int, ts timestamptz, value float8) "
                        "ON COMMIT DROP")
        self.row_days.update(np.unique(ts_ms // (_DAY_S * 1000)).tolist())
        with cur.copy("COPY sim_rows_stage FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(HEADER + pack_rows(sid, ts_ms, value) + TRAILER)

    def finish(self) -> None:
        """The hot-window samples into sample_rows (a sample stored before keeps its reading), and the
        hours written marked for the rollup task (service/telemetry/backfill.py): chunks, like blocks, are
        history its watermark never reads."""
        with self.raw.cursor() as cur:
            self.hours.mark(cur, with_blocks=True)
        if not self.row_days:
            return
        with self.raw.cursor() as cur:
            create_partitions(cur, [datetime.fromtimestamp(d * _DAY_S, UTC).date() for d in sorted(self.row_days)])
            cur.execute("INSERT INTO sample_rows (series_id, ts, value) SELECT * FROM sim_rows_stage "
                        "ON CONFLICT DO NOTHING")
            written = cur.rowcount
        self.row_duplicates = self.row_samples - written
        self.row_samples = written
        self.stored = self.chunk_samples + self.row_samples


def _analyze(engine: Engine, days: list[date]) -> None:
    """Statistics and BRIN summaries of the chunk partitions written (nothing waits for autovacuum)."""
    with engine.connect() as c:
        conn = c.execution_options(isolation_level="AUTOCOMMIT")
        for day in days:
            name = chunk_partition_name(day)
            if conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar():
                analyze_and_summarize(conn, name)
