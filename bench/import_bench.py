"""Import benchmark: 1M canonical samples of a 512-host fabric, against two anchors in the same run.

    python bench/import_bench.py [--samples 1000000] [--server postgresql://postgres@127.0.0.1/postgres]

1. fabricwatch: `fabricwatch import FILE` end to end (parse, resolve series, COPY, commit).
2. anchor A: `psql \\copy` of the same values as CSV into a narrow (ts, series_id, value) table
   with a (series_id, ts) index: the floor a naive loader could reach.
3. anchor B: Prometheus' own backfill, `promtool tsdb create-blocks-from openmetrics`.
Prints samples/s, peak memory and the ratios. Not a test: figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[1]
T0_MS = 1_764_460_800_000  # 2025-11-30T00:00:00Z
STEP_MS = 10_000
PORT_METRICS = ["port_rx_bytes_total", "port_tx_bytes_total", "port_rx_packets_total", "port_tx_packets_total",
                "port_rx_fcs_errors_total", "port_fec_corrected_bits_total", "port_rx_phy_bits_total",
                "port_symbol_errors_total", "port_ecn_marked_packets_total", "port_cnp_sent_total",
                "port_cnp_handled_total", "optic_temperature_celsius", "optic_voltage_volts"]
LANE_METRICS = ["optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes"]


def series_keys(hosts: int) -> list[str]:
    keys = []
    for h in range(hosts):
        dev = f"gpu-{h:04d}"
        for p in range(8):
            port = f"eth{p}"
            keys += [f'{m}{{device="{dev}",port="{port}"}}' for m in PORT_METRICS]
            keys += [f'{m}{{device="{dev}",port="{port}",priority="3"}}' for m in
                     ("port_pfc_rx_pause_frames_total", "port_pfc_tx_pause_frames_total")]
            keys += [f'{m}{{device="{dev}",port="{port}",lane="{ln}"}}' for m in LANE_METRICS for ln in range(4)]
    return keys


def write_inputs(out: Path, hosts: int, n: int) -> tuple[Path, Path, Path, int]:
    """The Prometheus text file, the same values as CSV (with series ids), and OpenMetrics for promtool."""
    keys = series_keys(hosts)
    steps = -(-n // len(keys))
    rng = random.Random(1)
    prom, csv, om = out / "in.prom", out / "in.csv", out / "in.om"
    count = 0
    with prom.open("w") as fp, csv.open("w") as fc, om.open("w") as fo:
        for t in range(steps):
            ts = T0_MS + t * STEP_MS
            for sid, key in enumerate(keys, 1):
                if count == n:
                    break
                v = round(rng.uniform(-5, 5), 3) if "optic" in key else t * 1000 + sid
                fp.write(f"{key} {v} {ts}\n")
                fc.write(f"{ts / 1000:.3f},{sid},{v}\n")
                fo.write(f"{key.replace('_total{', '{')} {v} {ts / 1000:.3f}\n")
                count += 1
        fo.write("# EOF\n")
    return prom, csv, om, count


def run_child(cmd: list[str], server: str, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (MiB) of a child process. Each run starts from the same state: the
    bench's own writes (inputs, schema, inventory) on disk and a fresh PostgreSQL checkpoint."""
    os.sync()
    with psycopg.connect(server, autocommit=True) as c:
        c.execute("CHECKPOINT")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) // 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--hosts", type=int, default=512)
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    args = ap.parse_args()

    dbname = f"fw_bench_{uuid.uuid4().hex[:8]}"
    base = args.server.rsplit("/", 1)[0]
    db_url = f"{base}/{dbname}"
    with psycopg.connect(args.server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{dbname}"')
    work = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        sys.path.insert(0, str(REPO))
        from service.migrate import upgrade

        upgrade(db_url)
        with psycopg.connect(db_url, autocommit=True) as c:
            for h in range(args.hosts):
                dev_id = c.execute("INSERT INTO devices (name, kind, role, gpus) VALUES (%s,'host','host',8) "
                                   "RETURNING id", (f"gpu-{h:04d}",)).fetchone()[0]
                c.cursor().executemany("INSERT INTO ports (device_id, name) VALUES (%s, %s)",
                                       [(dev_id, f"eth{p}") for p in range(8)])
        prom, csv, om, n = write_inputs(work, args.hosts, args.samples)
        print(f"{n} samples, {len(series_keys(args.hosts))} series, {prom.stat().st_size / 1e6:.0f} MB of text")

        env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url}
        fw_wall, fw_mem = run_child([str(REPO / ".venv/bin/fabricwatch"), "import", str(prom)], args.server, env)
        with psycopg.connect(db_url) as c:
            stored = c.execute("SELECT count(*) FROM samples").fetchone()[0]
        assert stored == n, f"stored {stored} of {n}"

        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("CREATE TABLE narrow (ts timestamptz NOT NULL, series_id int NOT NULL, value float8 NOT NULL)")
            c.execute("CREATE INDEX narrow_series_ts ON narrow (series_id, ts)")
        copy_sql = "\\copy narrow (ts, series_id, value) FROM PROGRAM " \
                   f"'awk -F, -v OFS=, ''{{$1=strftime(\"%Y-%m-%dT%H:%M:%S\", $1, 1) \"Z\"; print}}'' {csv}' CSV"
        copy_wall, _ = run_child(["psql", "-q", db_url, "-c", copy_sql], args.server)

        promtool = shutil.which("promtool")
        prom_wall = None
        if promtool:
            prom_wall, prom_mem = run_child([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om),
                                             str(work / "tsdb")], args.server)
        print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
        print(f"fabricwatch import : {fw_wall:7.2f} s  {n / fw_wall:10.0f} samples/s  peak {fw_mem} MiB")
        print(f"psql \\copy anchor  : {copy_wall:7.2f} s  {n / copy_wall:10.0f} samples/s")
        if prom_wall:
            print(f"promtool anchor    : {prom_wall:7.2f} s  {n / prom_wall:10.0f} samples/s  peak {prom_mem} MiB")
        print(f"ratio vs \\copy     : {copy_wall / fw_wall:.2f}x (goal >= 1.0x)")
        if prom_wall:
            print(f"ratio vs promtool  : {prom_wall / fw_wall:.2f}x (goal > 1.0x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with psycopg.connect(args.server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
