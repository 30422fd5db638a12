"""Ingest soak: a 4,096-GPU fabric's telemetry pushed through the real API for a sustained period.

    python bench/ingest_soak.py [--duration 1800] [--server postgresql://postgres@127.0.0.1/postgres]

The fabric: 512 hosts x 8 ports, 64 leaves and 32 spines x 64 ports = 10,240 ports, 40 series each
(counters, state, optics per lane): 409,600 series every 10 s = 40,960 samples/s target. Each poll
interval every device pushes its Prometheus text to POST /api/v1/import/prometheus of a uvicorn
server (the real ingest path: parse, resolve, COPY, commit), on an open-loop schedule: interval k
starts at t0 + 10 k whether or not the last one finished, so falling behind shows as lag.

While it runs, the rollup task (5m, 1h) runs every minute and the compression task every
`--compress-every` seconds (60; beat runs it every 300 s by default), each in its own thread with its own
connections. Compression moves whole hours past the hot window, never past the 5-minute rollup
watermark: with production's 1-hour window nothing would be old enough during the soak, so the bench
uses `--hot-s 0` and the hour that ends during the soak (start the soak a quarter to half an hour
before a full hour) is compressed while ingest goes on. Reported: achieved rate vs target, CPU of
the API (ingest) processes and of this database's PostgreSQL backends, their memory, database growth
and its size per day, rollup and compression run times, chunks written. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

REPO = Path(__file__).resolve().parents[1]
INTERVAL_S = 10.0
PORT_COUNTERS = ["port_rx_bytes_total", "port_tx_bytes_total", "port_rx_packets_total", "port_tx_packets_total",
                 "port_rx_errors_total", "port_tx_errors_total", "port_rx_fcs_errors_total",
                 "port_rx_discards_total", "port_tx_discards_total", "port_symbol_errors_total",
                 "port_rx_phy_bits_total", "port_fec_corrected_bits_total", "port_fec_corrected_codewords_total",
                 "port_fec_uncorrectable_codewords_total", "port_ecn_marked_packets_total", "port_cnp_sent_total",
                 "port_cnp_handled_total", "port_out_of_sequence_total", "port_out_of_buffer_total",
                 "port_link_down_events_total", "port_carrier_changes_total", "port_xmit_wait_ticks_total",
                 "port_link_error_recovery_total"]
PORT_GAUGES = ["port_oper_up", "port_admin_up", "port_speed_bits_per_second", "optic_temperature_celsius",
               "optic_voltage_volts"]
LANE_GAUGES = ["optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes"]
SERIES_PER_PORT = len(PORT_COUNTERS) + len(PORT_GAUGES) + 4 * len(LANE_GAUGES)  # 40


def fabric(hosts: int = 512, leaves: int = 64, spines: int = 32) -> list[tuple[str, str, int]]:
    """(device, role, ports) for a rail-optimised 4,096-GPU fabric."""
    return ([(f"gpu-{i:04d}", "host", 8) for i in range(hosts)] + [(f"leaf-{i:03d}", "leaf", 64)
            for i in range(leaves)] + [(f"spine-{i:02d}", "spine", 64) for i in range(spines)])


def port_name(role: str, p: int) -> str:
    return f"eth{p}" if role == "host" else f"Ethernet{p}"


def create_db(server: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.rsplit('/', 1)[0]}/{name}"
    sys.path.insert(0, str(REPO))
    from service.migrate import upgrade

    upgrade(url)
    return url


def drop_db(server: str, url: str) -> None:
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def add_inventory(url: str, devices: list[tuple[str, str, int]]) -> None:
    with psycopg.connect(url) as c:
        for name, role, ports in devices:
            kind = "host" if role == "host" else "switch"
            dev = c.execute("INSERT INTO devices (name, kind, role, gpus) VALUES (%s, %s, %s, %s) RETURNING id",
                            (name, kind, role, 8 if role == "host" else 0)).fetchone()[0]
            c.cursor().executemany("INSERT INTO ports (device_id, name) VALUES (%s, %s)",
                                   [(dev, port_name(role, p)) for p in range(ports)])


class Exposition:
    """Per-device Prometheus text for one poll: the body is built once; each poll stamps its time.

    Values repeat between polls (a flat counter is a valid counter): building 400k fresh lines
    every 10 s would cost the load generator a core that the 2-core bench machine needs for ingest.
    """

    _TS = "@@TS@@"

    def __init__(self, device: str, role: str, ports: int, seed: int) -> None:
        rng = random.Random(seed)
        lines = []
        for p in range(ports):
            lab = f'device="{device}",port="{port_name(role, p)}"'
            lines += [f"{m}{{{lab}}} {rng.randrange(10**12)} {self._TS}" for m in PORT_COUNTERS]
            lines += [f"{m}{{{lab}}} {rng.uniform(-2, 2):.3f} {self._TS}" for m in PORT_GAUGES]
            lines += [f'{m}{{{lab},lane="{ln}"}} {rng.uniform(-2, 2):.3f} {self._TS}'
                      for m in LANE_GAUGES for ln in range(4)]
        self.template = "\n".join(lines) + "\n"

    def text(self, ts_ms: int) -> str:
        return self.template.replace(self._TS, str(ts_ms))


@contextmanager
def api_server(db_url: str, port: int, workers: int, app_dir: Path = REPO,
               env_extra: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """The API under uvicorn; `app_dir`: another checkout's code (an older commit as the baseline);
    `env_extra`: more settings (bench/shards_soak.py: the shards' topology)."""
    with socket.socket() as s:  # a port another bench holds would get this bench's pushes
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SystemExit(f"port {port} is taken ({exc.strerror}): give another with --port") from None
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_AUTH_REQUIRED": "false",
           "FABRICWATCH_LOG_LEVEL": "WARNING", **(env_extra or {})}
    proc = subprocess.Popen([str(REPO / ".venv/bin/uvicorn"), "--factory", "service.api.app:create_app",
                             "--app-dir", str(app_dir),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
                             "--log-level", "warning", "--no-access-log"], env=env, cwd=app_dir)
    try:
        for _ in range(200):
            if proc.poll() is not None:
                raise SystemExit(f"uvicorn exited with {proc.returncode} before answering on port {port}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def proc_tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


class CpuMeter:
    """CPU seconds used by a changing set of processes (backends come and go): summed per pid."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.peak_rss: dict[int, int] = {}

    def sample(self, procs: list[psutil.Process]) -> None:
        for p in procs:
            try:
                t = p.cpu_times()
                used = t.user + t.system
                self.first.setdefault(p.pid, used)
                self.last[p.pid] = used
                mem = p.memory_info()  # private memory: RSS less shared pages (PostgreSQL's shared buffers)
                self.peak_rss[p.pid] = max(self.peak_rss.get(p.pid, 0), mem.rss - mem.shared)
            except psutil.Error:
                continue

    def seconds(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)

    def rss_mib(self) -> float:
        return sum(self.peak_rss.values()) / 2**20


def backends(db_url: str) -> list[psutil.Process]:
    name = db_url.rsplit("/", 1)[1]
    with psycopg.connect(db_url) as c:
        pids = [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> "
                                        "pg_backend_pid()", (name,))]
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))  # a local server only: the bench runs on the database host
        except psutil.Error:
            continue
    return out


def db_size(db_url: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT pg_database_size(current_database())").fetchone()[0]


@dataclass
class PushStats:
    written: int = 0
    pushes: int = 0
    errors: int = 0
    error_kinds: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    max_lag_s: float = 0.0
    intervals: int = 0
    cancelled: int = 0  # pushes still unanswered when a bounded drain ended (`push_loop(drain_s=...)`)


async def push_loop(base: str, devices: list[tuple[str, str, int]], stop_at: float, stats: PushStats,
                    concurrency: int, drain_s: float | None = None) -> None:
    """Every INTERVAL_S, each device pushes one poll; open loop (a late interval still starts on time).
    After the last interval the pushes in flight are awaited: all of them, or for `drain_s` at most, the
    rest then cancelled and counted in `stats.cancelled` (a backlog behind a slow layout would take as
    long again to drain)."""
    expos = [Exposition(n, r, p, i) for i, (n, r, p) in enumerate(devices)]
    sem = asyncio.Semaphore(concurrency)
    # idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them, so a push never
    # races the server's close (a ReadError with no response)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=4.0)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        async def one(e: Exposition, ts_ms: int) -> None:
            body = e.text(ts_ms)
            async with sem:
                t0 = time.perf_counter()
                try:
                    r = await client.post("/api/v1/import/prometheus", content=body)
                    r.raise_for_status()
                    stats.written += r.json()["written"]
                except httpx.HTTPStatusError as exc:
                    stats.errors += 1
                    stats.error_kinds[f"HTTP {exc.response.status_code}: {exc.response.text[:120]}"] += 1
                except httpx.HTTPError as exc:
                    stats.errors += 1
                    stats.error_kinds[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
                stats.latencies.append(time.perf_counter() - t0)
                stats.pushes += 1

        t0 = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        k = 0
        while True:
            due = t0 + k * INTERVAL_S
            if due >= stop_at:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            ts_ms = int(time.time() * 1000)
            # Spread the devices over the interval, as collection jitter does.
            for i, e in enumerate(expos):
                await asyncio.sleep(max(0.0, due + i * INTERVAL_S / len(expos) - time.monotonic()))
                task = asyncio.create_task(one(e, ts_ms + i))
                pending.add(task)
                task.add_done_callback(pending.discard)
            stats.max_lag_s = max(stats.max_lag_s, time.monotonic() - due - INTERVAL_S)
            stats.intervals += 1
            k += 1
        if pending:
            _, late = await asyncio.wait(set(pending), timeout=drain_s)
            for task in late:
                task.cancel()
            stats.cancelled += len(late)
            if late:
                await asyncio.wait(late)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of sustained ingest")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--concurrency", type=int, default=16, help="pushes in flight")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch database")
    ap.add_argument("--hot-s", type=float, default=0.0, help="compression's hot window (production: 3600)")
    ap.add_argument("--compress-every", type=float, default=60.0, help="seconds between compression runs "
                    "(beat: compress_interval_s, 300 by default; a minute here starts the run soon "
                    "after the hour closes); 0: no compression")
    args = ap.parse_args()

    devices = fabric()
    ports = sum(p for _, _, p in devices)
    target = ports * SERIES_PER_PORT / INTERVAL_S
    url = create_db(args.server, "fw_soak")
    try:
        add_inventory(url, devices)
        print(f"fabric: {len(devices)} devices, {ports} ports, {ports * SERIES_PER_PORT} series, "
              f"target {target:,.0f} samples/s for {args.duration:.0f} s")
        with api_server(url, args.port, args.workers) as proc:
            # A first interval creates the series; growth is measured from the steady state after it.
            warm = PushStats()
            asyncio.run(push_loop(f"http://127.0.0.1:{args.port}", devices, time.monotonic() + INTERVAL_S, warm,
                                  args.concurrency))
            size0, stats, api_cpu, pg_cpu = db_size(url), PushStats(), CpuMeter(), CpuMeter()
            rollup_runs: list[tuple[str, float, int]] = []
            compress_runs: list[tuple[str, float, float, dict[str, Any]]] = []
            stop = threading.Event()

            def meter() -> None:
                while not stop.wait(2):
                    api_cpu.sample(proc_tree(proc))
                    pg_cpu.sample(backends(url))

            api_cpu.sample(proc_tree(proc))
            pg_cpu.sample(backends(url))
            threads = [threading.Thread(target=meter, daemon=True),
                       threading.Thread(target=timed_rollups, args=(url, stop, rollup_runs), daemon=True)]
            if args.compress_every > 0:
                threads.append(threading.Thread(target=timed_compression, daemon=True,
                                                args=(url, stop, args.compress_every, args.hot_s, compress_runs)))
            for t in threads:
                t.start()
            t0 = time.monotonic()
            cpu0 = psutil.cpu_times()
            asyncio.run(push_loop(f"http://127.0.0.1:{args.port}", devices, t0 + args.duration, stats,
                                  args.concurrency))
            wall = time.monotonic() - t0
            api_cpu.sample(proc_tree(proc))
            pg_cpu.sample(backends(url))
            cpu1 = psutil.cpu_times()
            load = os.getloadavg()
            size1 = db_size(url)
            stop.set()
            for t in threads:  # a compression run still going finishes (outside the figures above)
                t.join(timeout=900)
        with psycopg.connect(url) as c:
            rows = c.execute("SELECT count(*) FROM samples").fetchone()[0]
            chunks, chunked = c.execute("SELECT count(*), coalesce(sum(n), 0) FROM sample_chunks").fetchone()
        machine_busy = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / wall
        lat = sorted(stats.latencies) or [0.0]
        rate = stats.written / wall
        grow = (size1 - size0) / wall
        print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
        print(f"achieved       : {rate:,.0f} samples/s of {target:,.0f} target ({rate / target:.1%}); "
              f"{stats.written:,} written in {wall:.0f} s, {stats.pushes} pushes, {stats.errors} errors, "
              f"{rows:,} samples as rows, {chunked:,} in {chunks:,} chunks")
        for kind, n in stats.error_kinds.most_common():
            print(f"push error     : {n} x {kind}")
        print(f"push latency   : p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.0f} ms,"
              f" max schedule lag {stats.max_lag_s:.1f} s")
        print(f"API (ingest)   : {api_cpu.seconds() / wall:.2f} cores, peak private RSS {api_cpu.rss_mib():.0f} MiB "
              f"({args.workers} uvicorn workers)")
        print(f"PG backends    : {pg_cpu.seconds() / wall:.2f} cores, peak private RSS {pg_cpu.rss_mib():.0f} MiB "
              f"(this database's backends only)")
        print(f"whole machine  : {machine_busy:.2f} of {os.cpu_count()} cores busy (load generator and compression's "
              f"client included; other sessions' work too); load average at the end {load[0]:.2f} {load[1]:.2f} "
              f"{load[2]:.2f}")
        print(f"db growth      : {grow / 2**20:.2f} MiB/s = {grow * 86400 / 2**30:.1f} GiB/day; "
              f"{(size1 - size0) / max(1, stats.written):.1f} bytes/sample; {size1 / 2**30:.2f} GiB at end")
        for level, secs, n in rollup_runs:
            print(f"rollup {level:3s}     : {secs:.2f} s, {n} rows")
        for at, secs, cpu, r in compress_runs:
            print(f"compression    : at {at}, {secs:.1f} s ({cpu:.1f} s client CPU): {r['samples']:,} samples into "
                  f"{r['chunks']:,} chunks, "
                  f"{r['batches']} batches, {r['periods']} periods, done until {r['done_until']}, "
                  f"complete {r['complete']}, busy {r['busy']}")
        if not compress_runs:
            print("compression    : no run (none enabled, or the soak ended before a run)")
    finally:
        if args.keep:
            print(f"kept {url}")
        else:
            drop_db(args.server, url)


def timed_rollups(db_url: str, stop: threading.Event, runs: list[tuple[str, float, int]]) -> None:
    """compute_rollups every 60 s as beat runs it; records each level's run time and rows."""
    sys.path.insert(0, str(REPO))
    from service.db import get_engine
    from service.telemetry.rollups import LEVELS, run_level

    engine = get_engine(db_url)
    while not stop.wait(60):
        for lv in LEVELS:
            t0 = time.perf_counter()
            r = run_level(engine, lv, now=datetime.now(UTC), lag_s=60, max_gap_s=900, max_chunks=24)
            if r.chunks:
                runs.append((lv.name, time.perf_counter() - t0, r.rows))


def timed_compression(db_url: str, stop: threading.Event, every_s: float, hot_s: float,
                      runs: list[tuple[str, float, float, dict[str, Any]]]) -> None:
    """run_compression every `every_s` as beat runs it (same batch limits as the defaults); records each
    run that found anything to do (its time and CompressRun) and, on the stop, a run still going."""
    sys.path.insert(0, str(REPO))
    from service.db import get_engine
    from service.telemetry.compress import run_compression

    engine = get_engine(db_url)
    while not stop.wait(every_s):
        at = datetime.now(UTC)
        t0, c0 = time.perf_counter(), time.thread_time()
        r = run_compression(engine, now=at, hot_s=hot_s, batch_series=2000, max_batches=2000)
        if r.batches or r.busy:
            runs.append((f"{at:%H:%M:%S}", time.perf_counter() - t0, time.thread_time() - c0, r.to_dict()))


if __name__ == "__main__":
    main()
