"""Shards (#20): the 4,096-GPU ingest soak on one server, on one shard and on two shards, in the same run.

    python bench/shards_soak.py [--duration 180] [--rounds 1] [--layouts single,1,2]

Starts its own PostgreSQL 15 servers (tests/shards/pg_cluster.py: initdb/pg_ctl, fsync off, on loopback): a
control server and two shard servers, and removes them at the end. The fabric of bench/ingest_soak.py
(512 hosts, 64 leaves, 32 spines; 409,600 series every 10 s = 40,960 samples/s offered) is split into two
pods of equal size: p1 = gpu-0000..0255, leaf-000..031, spine-00..15; p2 = the rest. Each phase gets fresh
databases and its own uvicorn API (the real `POST /api/v1/import/prometheus` path), pushed to on
ingest_soak's open-loop schedule for `--duration` seconds after one interval that creates the series:

- `single`: no shards; the database is on the control server (the anchor: the single-server import path).
- `1`: FABRICWATCH_SHARDS_URLS/PODS put both pods on shard s1 (the sharded import path, one shard).
- `2`: p1 on s1, p2 on s2.

Measured per phase: samples delivered vs offered, failed and cancelled pushes (the drain after the last
interval is bounded by `--drain`), push latency p50/p99, CPU of the API's processes and of each PostgreSQL
server (the postmaster and all its processes, reaped backends included: WAL writer, checkpointer,
autovacuum; CPU seconds over the phase's wall time = cores), samples stored per server by the phase's end,
CPU seconds per million samples stored, and the machine's load average. Rollups and compression do not
run here (see bench/ingest_soak.py for those).
All servers share this machine's cores. Not a test: the figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest_soak import (
    INTERVAL_S,
    SERIES_PER_PORT,
    CpuMeter,
    PushStats,
    api_server,
    fabric,
    port_name,
    proc_tree,
    push_loop,
)

from service.migrate import upgrade
from service.shards.setup import apply
from service.shards.topology import ShardSettings, Topology
from tests.shards.pg_cluster import PgServer

SERVERS = ("control", "s1", "s2")


def pod_of(device: str) -> str:
    """Two pods of equal size (5,120 ports each): the first half of hosts, leaves and spines, and the rest."""
    kind, num = device.rsplit("-", 1)
    half = {"gpu": 256, "leaf": 32, "spine": 16}[kind]
    return "p1" if int(num) < half else "p2"


def add_inventory(url: str, devices: list[tuple[str, str, int]]) -> None:
    with psycopg.connect(url) as c:
        c.execute("INSERT INTO pods (name) VALUES ('p1'), ('p2')")
        for name, role, ports in devices:
            kind = "host" if role == "host" else "switch"
            dev = c.execute("INSERT INTO devices (name, kind, role, gpus, pod) VALUES (%s, %s, %s, %s, %s) "
                            "RETURNING id", (name, kind, role, 8 if role == "host" else 0, pod_of(name))).fetchone()[0]
            c.cursor().executemany("INSERT INTO ports (device_id, name) VALUES (%s, %s)",
                                   [(dev, port_name(role, p)) for p in range(ports)])


def server_cpu(server: PgServer) -> float:
    """CPU seconds used so far by the server: the postmaster, the backends it has reaped (its children's
    times: a connection that lives less than a sampling interval counts too) and those still running."""
    root = psutil.Process(int((server.data_dir / "postmaster.pid").read_text().split()[0]))
    t = root.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in root.children():
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:  # exited between the listing and the read: its time is in the reaped
            continue
    return total


def count_samples(url: str) -> int:
    with psycopg.connect(url) as c:
        return c.execute("SELECT count(*) FROM samples").fetchone()[0]


def disk(url: str) -> tuple[int, int]:
    """The database's size and the server's WAL position, in bytes (each server holds one phase's data)."""
    with psycopg.connect(url) as c:
        return c.execute("SELECT pg_database_size(current_database()), "
                         "pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()


@dataclass
class Phase:
    layout: str
    wall: float = 0.0
    stats: PushStats = field(default_factory=PushStats)
    api_cores: float = 0.0
    pg_cpu_s: dict[str, float] = field(default_factory=dict)  # server -> CPU seconds over the phase
    stored: dict[str, int] = field(default_factory=dict)  # server -> samples stored during the phase
    grown: dict[str, tuple[int, int]] = field(default_factory=dict)  # server -> (database, WAL) bytes written
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load0: float = 0.0
    machine_busy: float = 0.0
    started: str = ""


def run_phase(layout: str, servers: dict[str, PgServer], devices: list[tuple[str, str, int]],
              args: argparse.Namespace, tag: str) -> Phase:
    control = servers["control"]
    control_url = control.create_database(f"ctl_{tag}")
    upgrade(control_url)
    add_inventory(control_url, devices)
    shard_urls = {"single": {}, "1": {"s1": servers["s1"].url(f"shard_{tag}")},
                  "2": {"s1": servers["s1"].url(f"shard_{tag}"), "s2": servers["s2"].url(f"shard_{tag}")}}[layout]
    pods = {"single": {}, "1": {"s1": ["p1", "p2"]}, "2": {"s1": ["p1"], "s2": ["p2"]}}[layout]
    env: dict[str, str] = {}
    if shard_urls:
        apply(Topology.of(control_url, ShardSettings(urls=shard_urls, pods=pods)))
        env = {"FABRICWATCH_SHARDS_URLS": json.dumps(shard_urls), "FABRICWATCH_SHARDS_PODS": json.dumps(pods)}
    # where samples land, per server
    stores = {"control": control_url} if not shard_urls else {n: u for n, u in shard_urls.items()}
    out = Phase(layout)
    try:
        with api_server(control_url, args.port, args.workers, env_extra=env) as proc:
            base = f"http://127.0.0.1:{args.port}"
            warm = PushStats()  # the first interval creates the series
            asyncio.run(push_loop(base, devices, time.monotonic() + INTERVAL_S, warm, args.concurrency))
            if warm.errors:
                raise SystemExit(f"layout {layout}: {warm.errors} failed pushes while creating the series: "
                                 f"{warm.error_kinds.most_common(3)}")
            before = {n: count_samples(u) for n, u in stores.items()}
            disk0 = {n: disk(u) for n, u in stores.items()}
            api = CpuMeter()
            pg0 = {n: server_cpu(s) for n, s in servers.items()}
            stop = threading.Event()

            def sample() -> None:
                api.sample(proc_tree(proc))

            def meter() -> None:
                while not stop.wait(2):
                    sample()

            sample()
            th = threading.Thread(target=meter, daemon=True)
            th.start()
            out.started, out.load0 = time.strftime("%H:%M:%S", time.gmtime()), os.getloadavg()[0]
            t0, cpu0 = time.monotonic(), psutil.cpu_times()
            asyncio.run(push_loop(base, devices, t0 + args.duration, out.stats, args.concurrency, args.drain))
            out.wall = time.monotonic() - t0
            sample()
            out.pg_cpu_s = {n: server_cpu(s) - pg0[n] for n, s in servers.items()}
            cpu1, out.load = psutil.cpu_times(), os.getloadavg()
            stop.set()
            th.join()
            # by the phase's end (the API may still store cancelled pushes: not in these CPU figures either)
            out.stored = {n: count_samples(u) - before[n] for n, u in stores.items()}
            out.grown = {n: tuple(b - a for a, b in zip(disk0[n], disk(u), strict=True))  # type: ignore[misc]
                         for n, u in stores.items()}
            out.machine_busy = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / out.wall
            out.api_cores = api.seconds() / out.wall
    finally:
        for url in [control_url, *shard_urls.values()]:
            server, name = url.rsplit("/", 1)
            with psycopg.connect(f"{server}/postgres", autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return out


def report(p: Phase, target: float, duration: float) -> None:
    s = p.stats
    lat = sorted(s.latencies) or [0.0]
    offered = target * duration
    print(f"--- layout {p.layout} (started {p.started} UTC, load average {p.load0:.1f} at the start, "
          f"{p.load[0]:.1f} {p.load[1]:.1f} {p.load[2]:.1f} at the end; machine {p.machine_busy:.2f} cores busy)")
    print(f"delivered     : {s.written / p.wall:,.0f} samples/s over {p.wall:.0f} s ({s.written:,} of "
          f"{offered:,.0f} offered = {s.written / offered:.1%}); {s.pushes} pushes answered, {s.errors} failed, "
          f"{s.cancelled} unanswered after the drain; max schedule lag {s.max_lag_s:.1f} s")
    for kind, n in s.error_kinds.most_common(5):
        print(f"push error    : {n} x {kind}")
    print(f"push latency  : p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.0f} ms")
    stored_all = sum(p.stored.values())
    print(f"API           : {p.api_cores:.2f} cores, {p.api_cores * p.wall / max(1, stored_all) * 1e6:.1f} "
          f"CPU s per million samples stored")
    for n, cpu in p.pg_cpu_s.items():
        stored = p.stored.get(n, 0)
        per = f", {cpu / stored * 1e6:.1f} CPU s per million samples stored" if stored else ""
        if stored and n in p.grown:
            db, wal = p.grown[n]
            per += f"; {db / stored:.1f} B/sample database growth, {wal / stored:.1f} B/sample WAL"
        print(f"PG {n:8s}   : {cpu / p.wall:.2f} cores, {stored:,} samples stored{per}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of ingest per phase")
    ap.add_argument("--rounds", type=int, default=1, help="times through the layouts (alternating order)")
    ap.add_argument("--layouts", default="single,1,2", help="comma-separated: single, 1, 2")
    ap.add_argument("--drain", type=float, default=30.0, help="seconds to await pushes in flight after the last "
                    "interval; the rest are cancelled and counted")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--concurrency", type=int, default=16, help="pushes in flight")
    ap.add_argument("--port", type=int, default=18441)
    args = ap.parse_args()
    layouts = args.layouts.split(",")
    if bad := [x for x in layouts if x not in ("single", "1", "2")]:
        raise SystemExit(f"--layouts: unknown layout(s) {bad} (single, 1, 2)")
    devices = fabric()
    ports = sum(p for _, _, p in devices)
    target = ports * SERIES_PER_PORT / INTERVAL_S
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    print(f"fabric: {len(devices)} devices, {ports} ports in 2 pods, {ports * SERIES_PER_PORT} series, "
          f"{target:,.0f} samples/s offered for {args.duration:.0f} s per phase; layouts {layouts} x {args.rounds}")
    servers = {n: PgServer(n) for n in SERVERS}
    try:
        for s in servers.values():
            s.start()
        for r in range(args.rounds):
            for layout in layouts if r % 2 == 0 else layouts[::-1]:
                phase = run_phase(layout, servers, devices, args, f"r{r}_{layout}")
                report(phase, target, args.duration)
                sys.stdout.flush()
    finally:
        for s in servers.values():
            s.remove()


if __name__ == "__main__":
    main()
