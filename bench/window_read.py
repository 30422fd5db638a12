"""Reading a short window out of imported history (import blocks): `fabricwatch detect --at`'s read.

    python bench/window_read.py [--series 2000] [--step-s 10] [--server postgresql://postgres@127.0.0.1/postgres]

A scratch database holds a day of imported history: `--series` series with a sample every `--step-s`,
stored as an import stores new series (one block per series and UTC day). The read is
`service/telemetry/store.read_samples` over 60 s and 5 min windows at several times of the day (a live
cycle's new samples; `detect --at` reads them through it), median of the repeats, first with the
block-unnesting functions of migration 0240 and then, on the same data, after migration 0250 (only
the window's slice of each block). Not a test.
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

from service.migrate import upgrade  # noqa: E402
from service.telemetry.store import read_samples  # noqa: E402

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
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    args = ap.parse_args()
    name = f"fw_window_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{args.server.rsplit('/', 1)[0]}/{name}"
    try:
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
