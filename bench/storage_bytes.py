"""Bytes per sample on disk after compression, against Prometheus' TSDB on the same samples.

    python bench/storage_bytes.py [--ports 4] [--days 7] [--server postgresql://postgres@127.0.0.1/postgres]

The data: the 4,096-GPU soak's metric mix (bench/ingest_soak.py: 23 port counters, 5 port gauges,
3 optics gauges x 4 lanes = 40 series per port) for `--ports` ports, every 10 s for `--days` days,
with values as devices report them: byte and packet counters at a utilisation that wanders,
error counters mostly still with rare bursts, FEC corrections steady, state gauges constant, module
temperature in 1/256 degC, voltage in 100 uV, tx bias in 2 uA, rx/tx power read in 0.1 uW and given
in dBm (full floats); per-device poll times with a few ms of jitter.

In one run: the samples are stored as rows (COPY into `sample_rows`), measured, then compressed as
the beat task does in steady state (one run per hour of data, each moving the hour past the hot
window; each day's partition truncated once closed), measured again (table + TOAST + indexes of every
sample table); the same samples are written as OpenMetrics, turned into TSDB blocks by
`promtool tsdb create-blocks-from openmetrics`, and measured with du. Also: reading 7 days of one
port's 40 series (service/telemetry/store.read_samples) as rows and as chunks. Not a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
from sqlalchemy import Connection, text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ingest_soak import LANE_GAUGES, PORT_COUNTERS, PORT_GAUGES, create_db, drop_db  # noqa: E402

from service.db import dispose_engines, get_engine  # noqa: E402
from service.telemetry.compress import run_compression  # noqa: E402
from service.telemetry.copy_format import HEADER, TRAILER, pack_rows  # noqa: E402
from service.telemetry.partitions import ensure_partitions  # noqa: E402
from service.telemetry.rollups import run_rollups  # noqa: E402
from service.telemetry.service import query_series  # noqa: E402
from service.telemetry.store import read_samples  # noqa: E402

STEP_MS = 10_000
BLOCK_MS = 2 * 3600 * 1000  # Prometheus' block range (promtool's, and the head's)
T0 = datetime(2026, 11, 2, tzinfo=UTC)
LINE_BPS = 400e9
METRIC_OF: dict[int, str] = {}


def _walk(rng: np.random.Generator, n: int, lo: float, hi: float, sigma: float) -> np.ndarray:
    """A bounded random walk, smoothed: utilisation, temperature and optical power drift like this."""
    x = np.clip(np.cumsum(rng.normal(0, sigma, n)) + (lo + hi) / 2, lo, hi)
    return np.convolve(x, np.ones(30) / 30, mode="same")


def series_values(metric: str, n: int, rng: np.random.Generator, util: np.ndarray, flat: bool) -> np.ndarray:
    """One series' values as a device reports them (see the module's doc); `flat`: as the soak pushes them,
    one value repeated (bench/ingest_soak.py)."""
    if flat:
        return np.full(n, float(rng.integers(10**12)) if metric in PORT_COUNTERS else round(rng.uniform(-2, 2), 3))
    dt = STEP_MS / 1000
    if metric in PORT_COUNTERS:
        if metric.endswith("bytes_total"):
            inc = np.floor(util * LINE_BPS / 8 * dt * rng.uniform(0.97, 1.03, n))
        elif metric.endswith("packets_total"):
            inc = np.floor(util * LINE_BPS / 8 * dt / rng.uniform(3000, 4200, n))
        elif metric == "port_rx_phy_bits_total":
            inc = np.full(n, LINE_BPS * dt)
        elif metric.startswith("port_fec_corrected"):
            inc = rng.poisson(4e4 if "bits" in metric else 2e3, n).astype(float)
        elif metric in ("port_ecn_marked_packets_total", "port_cnp_sent_total", "port_cnp_handled_total",
                        "port_xmit_wait_ticks_total"):
            inc = rng.poisson(np.maximum(util - 0.6, 0) * 5e4).astype(float)
        else:  # errors, discards, link events: mostly still, a rare burst
            inc = np.where(rng.random(n) < 2e-4, rng.integers(1, 50, n), 0).astype(float)
        return np.cumsum(inc) + float(rng.integers(0, 10**9))
    if metric in ("port_oper_up", "port_admin_up"):
        return np.ones(n)
    if metric == "port_speed_bits_per_second":
        return np.full(n, LINE_BPS)
    if metric == "optic_temperature_celsius":
        return np.round(_walk(rng, n, 38, 62, 0.02) * 256) / 256
    if metric == "optic_voltage_volts":
        return np.round(rng.normal(3.3, 0.002, n) * 1e4) / 1e4
    if metric == "optic_tx_bias_amperes":
        return np.round(_walk(rng, n, 0.006, 0.009, 2e-6) / 2e-6) * 2e-6
    tenths_uw = np.maximum(np.round(_walk(rng, n, 5000, 11000, 5) + rng.normal(0, 20, n)), 1)
    return 10 * np.log10(tenths_uw / 1e4)  # dBm of mW


def fabric_series(ports: int) -> list[tuple[str, int, int | None]]:
    """(metric, port index, lane) of the soak's 40 series per port."""
    out: list[tuple[str, int, int | None]] = []
    for p in range(ports):
        out += [(m, p, None) for m in PORT_COUNTERS + PORT_GAUGES]
        out += [(m, p, ln) for m in LANE_GAUGES for ln in range(4)]
    return out


def copy_db(server: str, url: str) -> str:
    """A copy of the database at `url` (CREATE DATABASE .. TEMPLATE); its URL."""
    name = f"{url.rsplit('/', 1)[1]}_rows"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{url.rsplit("/", 1)[1]}"')
    return f"{url.rsplit('/', 1)[0]}/{name}"


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


_SIZE_SQL = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
JOIN pg_inherits i ON i.inhrelid = c.oid JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = ANY(%s)"""


def sample_bytes(url: str) -> dict[str, int]:
    with psycopg.connect(url) as c:
        out = {t: c.execute(_SIZE_SQL, [[t]]).fetchone()[0] for t in ("sample_rows", "sample_chunks")}
        out["sample_blocks"] = c.execute("SELECT pg_total_relation_size('sample_blocks')").fetchone()[0]
    return out


# /api/v1/series' raw read before issue #22: one query per series (samples_between was raw_rows_between)
_OLD_POINTS_SQL = """
SELECT (extract(epoch FROM ts) * 1000)::bigint, value FROM raw_rows_between(:start, :end)
WHERE series_id = :sid ORDER BY ts
"""


def read_paths(rows_url: str, chunks_url: str, sids: list[int], lo: datetime, hi: datetime, repeat: int = 7
               ) -> dict[str, tuple[float, int]]:
    """Median seconds and samples (points) of the 7-day read of one port's series, the two databases read in
    turn so that the load other jobs put on the machine falls on both alike: the read /series did before
    issue #22 (rows), the store's raw read (rows, then chunks), /series' default rolled-up answer (both)."""
    paths: dict[str, Callable[[Connection], int]] = {
        "old": lambda c: sum(len(c.execute(text(_OLD_POINTS_SQL), {"sid": sid, "start": lo, "end": hi}).all())
                             for sid in sids),
        "store": lambda c: len(read_samples(c, lo, hi, sids)),
        "rollups": lambda c: sum(len(r.points) for m in dict.fromkeys(METRIC_OF[s] for s in sids)
                                 for r in query_series(conn=c, metric=m, start=lo, end=hi, device="leaf-000",
                                                       port="Ethernet0")),
    }
    times: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    with get_engine(rows_url).connect() as rows, get_engine(chunks_url).connect() as chunks:
        for _ in range(repeat):
            for name, fn in paths.items():
                for db, conn in (("rows", rows), ("chunks", chunks)):
                    if name == "old" and db == "chunks":
                        continue
                    t = time.perf_counter()
                    counts[f"{name}_{db}"] = fn(conn)
                    times.setdefault(f"{name}_{db}", []).append(time.perf_counter() - t)
    return {k: (statistics.median(v), counts[k]) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=4, help="ports of the soak's mix (40 series each)")
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    ap.add_argument("--values", choices=["device", "flat"], default="device",
                    help="device: values as devices report them; flat: the soak's repeated values")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database and files")
    args = ap.parse_args()
    n = args.days * 86_400_000 // STEP_MS
    specs = fabric_series(args.ports)
    total = n * len(specs)
    print(f"{len(specs)} series ({args.ports} ports x 40), {args.days} days at {STEP_MS / 1000:.0f} s: "
          f"{total:,} samples, {args.values} values; {platform.node()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC')}")
    url = create_db(args.server, "fw_bytes")
    rows_url = ""
    tmp = Path(tempfile.mkdtemp(prefix="fw_bytes_"))
    try:
        with psycopg.connect(url) as c:
            dev = c.execute("INSERT INTO devices (name, kind, role, gpus) VALUES ('leaf-000', 'switch', 'leaf', 0) "
                            "RETURNING id").fetchone()[0]
            port_ids = [c.execute("INSERT INTO ports (device_id, name) VALUES (%s, %s) RETURNING id",
                                  (dev, f"Ethernet{p}")).fetchone()[0] for p in range(args.ports)]
            sids = [c.execute("INSERT INTO series (metric, device_id, port_id, lane, saturating) "
                              "VALUES (%s, %s, %s, %s, false) RETURNING id",
                              (m, dev, port_ids[p], ln)).fetchone()[0] for m, p, ln in specs]
        METRIC_OF.update({sid: m for sid, (m, _, _) in zip(sids, specs, strict=True)})
        with get_engine(url).begin() as conn:
            ensure_partitions(conn, T0.date(), (T0 + timedelta(days=args.days)).date())
        # generate, store as rows, write as OpenMetrics: series by series, the same arrays
        t = time.perf_counter()
        rng = np.random.default_rng(22)
        base_ms = int(T0.timestamp() * 1000)
        ts_ms = base_ms + np.arange(n, dtype=np.int64) * STEP_MS + rng.integers(0, 8, n)  # one device: one clock
        # promtool reads its whole input once per 2-hour block: one file per block window keeps that linear
        window = np.searchsorted(ts_ms, base_ms + np.arange(1, n * STEP_MS // BLOCK_MS + 1) * BLOCK_MS)
        bounds = [0, *window.tolist()]
        om_dir = tmp / "om"
        om_dir.mkdir()
        files = [open(om_dir / f"{i:04d}.om", "w") for i in range(len(bounds) - 1)]  # noqa: SIM115
        try:
            with psycopg.connect(url) as c:
                utils = [_walk(rng, n, 0.05, 0.9, 0.01) for _ in range(args.ports)]
                stamps = [f"{x // 1000}.{x % 1000:03d}" for x in ts_ms.tolist()]
                for sid, (metric, p, lane) in zip(sids, specs, strict=True):
                    values = series_values(metric, n, rng, utils[p], args.values == "flat")
                    with c.cursor().copy("COPY sample_rows (series_id, ts, value) FROM STDIN (FORMAT BINARY)") as cp:
                        cp.write(HEADER + pack_rows(np.full(n, sid), ts_ms, values) + TRAILER)
                    head = f"{metric}{{device=\"leaf-000\",port=\"Ethernet{p}\""
                    head += (f",lane=\"{lane}\"}} " if lane is not None else "} ")
                    vals = values.tolist()
                    for f, a, b in zip(files, bounds[:-1], bounds[1:], strict=True):
                        f.write("".join(f"{head}{v!r} {t}\n" for v, t in zip(vals[a:b], stamps[a:b], strict=True)))
        finally:
            for f in files:
                f.write("# EOF\n")
                f.close()
        om_bytes = sum(f.stat().st_size for f in om_dir.iterdir())
        print(f"generated and stored as rows in {time.perf_counter() - t:.0f} s; OpenMetrics "
              f"{om_bytes / 1e6:.0f} MB in {len(files)} files")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("VACUUM (ANALYZE) sample_rows")
        rows = sample_bytes(url)
        port0 = sids[:40]
        lo, hi = T0, T0 + timedelta(days=args.days)
        t = time.perf_counter()
        run_rollups(get_engine(url), now=hi + timedelta(minutes=2), max_chunks=100_000)
        print(f"rollups of the {args.days} days in {time.perf_counter() - t:.0f} s")
        dispose_engines()  # a template must have no connections
        rows_url = copy_db(args.server, url)  # stays rows: the reads compare the two

        # Prometheus: the same samples into TSDB blocks
        t = time.perf_counter()
        blocks = tmp / "tsdb"
        for f in sorted(om_dir.iterdir()):
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(f), str(blocks)],
                           check=True)
        prom = _dir_bytes(blocks)
        prom_s = time.perf_counter() - t

        # compression as the beat task runs it: each hour once it is past the 1-hour hot window
        engine = get_engine(url)
        t = time.perf_counter()
        runs = 0
        for h in range(args.days * 24):
            run = run_compression(engine, now=T0 + timedelta(hours=h + 2, minutes=1), hot_s=3600)
            runs += 1
            assert run.complete and not run.busy
        comp_s = time.perf_counter() - t
        after = sample_bytes(url)
        for u in (rows_url, url):  # the same statistics for the rollups in both, whatever autovacuum did
            with psycopg.connect(u, autocommit=True) as c:
                c.execute("ANALYZE rollup_5m")
                c.execute("ANALYZE rollup_1h")
        reads = read_paths(rows_url, url, port0, lo, hi)
        assert reads["store_rows"][1] == reads["store_chunks"][1] == reads["old_rows"][1] == 40 * n
        assert reads["rollups_rows"][1] == reads["rollups_chunks"][1]
        with psycopg.connect(url) as c:
            left = c.execute("SELECT count(*) FROM sample_rows").fetchone()[0]
            chunks = c.execute("SELECT count(*), sum(octet_length(data)) FROM sample_chunks").fetchone()

        stored = sum(after.values())
        print(f"rows:        {sum(rows.values()) / total:6.2f} B/sample ({sum(rows.values()) / 1e6:,.0f} MB: "
              f"heap, primary key, BRIN)")
        print(f"chunks:      {stored / total:6.2f} B/sample ({stored / 1e6:,.1f} MB: {chunks[0]:,} chunks, "
              f"{chunks[1] / total:.2f} B/sample of encoded data; {left:,} rows left in the hot window) "
              f"after {runs} hourly runs in {comp_s:.0f} s ({total / comp_s:,.0f} samples/s)")
        print(f"Prometheus:  {prom / total:6.2f} B/sample ({prom / 1e6:,.1f} MB in "
              f"{sum(1 for _ in blocks.iterdir())} blocks; promtool took {prom_s:.0f} s)")
        print(f"ratio:       {stored / prom:.2f}x Prometheus; rows were {sum(rows.values()) / prom:.0f}x")
        ms = {k: v[0] * 1000 for k, v in reads.items()}
        print(f"read {args.days} days of one port's 40 series, median of 7, the two databases in turn: raw "
              f"({40 * n:,} samples): as /series read them before issue #22 {ms['old_rows']:.0f} ms; store, rows "
              f"{ms['store_rows']:.0f} ms, chunks {ms['store_chunks']:.0f} ms "
              f"({ms['old_rows'] / ms['store_chunks']:.1f}x faster than before); "
              f"rolled up ({reads['rollups_rows'][1]:,} points, /series default): "
              f"rows {ms['rollups_rows']:.0f} ms, chunks {ms['rollups_chunks']:.0f} ms")
    finally:
        dispose_engines()
        if args.keep:
            print(f"kept: {url}, {rows_url} and {tmp}")
        else:
            drop_db(args.server, url)
            if rows_url:
                drop_db(args.server, rows_url)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
