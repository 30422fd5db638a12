"""Reading a short window out of imported history (import blocks) or polled rows: a live cycle's read.

    python bench/window_read.py [--series 2000] [--step-s 10] [--server postgresql://postgres@127.0.0.1/postgres]
    python bench/window_read.py --rows [--series 3300] [--step-s 10]

A scratch database holds a day of imported history: `--series` series with a sample every `--step-s`,
stored as an import stores new series (one block per series and UTC day). The read is
`service/telemetry/store.read_samples` over 60 s and 5 min windows at several times of the day (a live
cycle's new samples; `detect --at` reads them through it), median of the repeats, first with the
block-unnesting functions of migration 0240 and then, on the same data, after migration 0250 (only
the window's slice of each block). Not a test.

With `--rows` the scratch database holds two hours of polled samples as hot rows (`sample_rows`, what a live
poll writes), and each window is read twice on the same data: as `read_samples` read every series until
2026-12-06 (a COPY of a row of arrays per series: a Python step per series), the anchor, and as it reads
now (a row of arrays per 1,024 series); both must return the same samples. --series 3300 is the evaluation's
72-port fabric.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from service.migrate import upgrade  # noqa: E402
from service.telemetry import store  # noqa: E402
from service.telemetry.partitions import _SUMMARIZE_SQL, create_partitions, partition_name  # noqa: E402
from service.telemetry.store import Samples, read_samples  # noqa: E402

DAY = datetime(2026, 11, 2, tzinfo=UTC)


def load(url: str, series: int, step_s: int) -> int:
    """A block per series for the day, built server-side (times strictly increasing, as an import's)."""
    with psycopg.connect(url) as c:
        c.execute("""
INSERT INTO sample_blocks (series_id, first_ts, last_ts, ts, vals)
SELECT s, %(day)s, %(day)s + (%(n)s - 1) * make_interval(secs => %(step)s),
       array(SELECT %(day)s + i * make_interval(secs => %(step)s) FROM generate_series(0, %(n)s - 1) i),
       array(SELECT (s * 1000 + i)::float8 FROM generate_series(0, %(n)s - 1) i)
FROM generate_series(1, %(series)s) s""", {"day": DAY, "n": 86400 // step_s, "step": step_s, "series": series})
        c.execute("ANALYZE sample_blocks")
    return series * (86400 // step_s)


def load_rows(url: str, series: int, step_s: int, hours: int = 2) -> int:
    """Hot rows, as polls write them: every series every `step_s` for `hours` from DAY."""
    n = hours * 3600 // step_s
    with psycopg.connect(url) as c:
        with c.cursor() as cur:
            create_partitions(cur, [DAY.date()])
        c.execute("""
INSERT INTO sample_rows (series_id, ts, value)
SELECT s, %(day)s + i * make_interval(secs => %(step)s), (s * 1000 + i)::float8
FROM generate_series(0, %(n)s - 1) i CROSS JOIN generate_series(1, %(series)s) s""",
                  {"day": DAY, "n": n, "step": step_s, "series": series})
        c.execute(_SUMMARIZE_SQL, ([partition_name(DAY.date())],))  # as an import does (partitions.py)
        c.execute("ANALYZE sample_rows")
    return series * n


def read_per_series(conn: psycopg.Connection, lo: datetime, hi: datetime) -> Samples:
    """The anchor: `read_samples` of every series as it was until 2026-12-06 (a row of arrays per series)."""
    rows_sql = store.per_series("SELECT series_id, ts, value FROM raw_rows_between(%(lo)s, %(hi)s)")
    query = f"SELECT * FROM ({rows_sql}) a CROSS JOIN (SELECT NULL::bytea) b UNION ALL {store._chunk_query(False)}"
    with conn.cursor() as cur:
        rows, chunks = store.copy_rows_and_chunks(cur, query, {"day": store._day_floor(lo), "lo": lo, "hi": hi})
    return store.merge(store._decoded(chunks, lo, hi), rows)[0] if chunks else rows


def measure_rows(url: str, repeats: int) -> None:
    with psycopg.connect(url) as c:
        for width in (10, 60, 300, 600):
            times: dict[str, list[float]] = {"per series (anchor)": [], "per 1,024 series": []}
            got = 0
            for k in range(repeats):
                lo = DAY + timedelta(minutes=15 + k * 90 / max(repeats - 1, 1))
                hi = lo + timedelta(seconds=width)
                for label, read in zip(times, (read_per_series, read_samples), strict=True):
                    t0 = time.perf_counter()
                    out = read(c, lo, hi)
                    times[label].append(time.perf_counter() - t0)
                    if label == "per series (anchor)":
                        want = out
                    else:
                        assert all(np.array_equal(getattr(out, f), getattr(want, f))
                                   for f in ("sid", "ts_us", "value")), (lo, hi)
                got = len(out)
            a, b = (statistics.median(t) * 1000 for t in times.values())
            print(f"window {width:4d} s: {got:,} samples; a row per series {a:,.1f} ms, a row per 1,024 series "
                  f"{b:,.1f} ms ({a / b:.1f}x), median of {repeats}")


def measure(url: str, repeats: int) -> dict[str, tuple[float, int]]:
    out = {}
    with psycopg.connect(url) as c:
        for width in (60, 300):
            times, got = [], 0
            for k in range(repeats):
                lo = DAY + timedelta(hours=1 + k * 22 / max(repeats - 1, 1))
                t0 = time.perf_counter()
                got = len(read_samples(c, lo, lo + timedelta(seconds=width)))
                times.append(time.perf_counter() - t0)
            out[f"{width} s"] = (statistics.median(times) * 1000, got)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=2000)
    ap.add_argument("--step-s", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", action="store_true", help="polled hot rows, not import blocks (above)")
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    args = ap.parse_args()
    name = f"fw_window_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{args.server.rsplit('/', 1)[0]}/{name}"
    try:
        if args.rows:
            upgrade(url)
            n = load_rows(url, args.series, args.step_s)
            print(f"machine: {platform.node()} {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
            print(f"history: {args.series} series x 2 h at {args.step_s} s = {n:,} samples as hot rows")
            measure_rows(url, args.repeats)
            print(f"load average at the end {os.getloadavg()[0]:.2f}")
            return
        upgrade(url, "0240")
        n = load(url, args.series, args.step_s)
        print(f"machine: {platform.node()} {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        print(f"history: {args.series} series x a day at {args.step_s} s = {n:,} samples in {args.series} blocks")
        before = measure(url, args.repeats)
        upgrade(url)
        after = measure(url, args.repeats)
        for k in before:
            (b, nb), (a, na) = before[k], after[k]
            assert nb == na, (k, nb, na)
            print(f"window {k:5s}: {nb:,} samples; unnest whole blocks {b:,.0f} ms, the window's slice "
                  f"{a:,.0f} ms ({b / a:.1f}x), median of {args.repeats}")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        with psycopg.connect(args.server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
