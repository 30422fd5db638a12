"""Shards (#20): a fleet-wide `/api/v1/series` read with 1, 2 and 3 shards, against the single-server read.

    python bench/shards_fleet.py [--devices-per-pod 16] [--ports 8] [--minutes 60] [--repeat 5]

Starts its own PostgreSQL servers (tests/shards/pg_cluster.py: a control server and three shard servers on
loopback, initdb/pg_ctl of PostgreSQL 15, fsync off) and removes them at the end. One fabric of 3 pods, each
`--devices-per-pod` switches with `--ports` ports, one counter per port at 10 s for `--minutes`, is stored
four ways: one server without shards (the baseline), and with the 3 pods on 1 shard, on 2 (p1 | p2 p3) and on 3
shards; the control database is a server of its own each time. Measured per layout: the ingest of the same
samples (service/shards/ingest.py, one transaction per shard), and the read of every series of the metric over
the whole range (counters as rates), and of one device, as the median of `--repeat` runs after one warm-up.
Every layout must return the same points as the baseline (checked), and one device's read must open a
connection to one shard only, generic plans forced (checked). All servers share this machine's cores:
shards here show the cost of the foreign-table path, not the parallelism of separate machines.
Not a test: the figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.db import get_engine, session_scope
from service.inventory.models import Device, Pod, Port
from service.migrate import upgrade
from service.shards import fleet
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.shards.topology import ShardSettings, Topology
from service.telemetry.ingest import Ingestor
from service.telemetry.samples import Sample
from service.telemetry.service import query_series
from tests.shards.pg_cluster import PgServer

PODS = ("p1", "p2", "p3")
METRIC = "port_rx_bytes_total"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LAYOUTS = {1: {"s1": list(PODS)}, 2: {"s1": ["p1"], "s2": ["p2", "p3"]}, 3: {"s1": ["p1"], "s2": ["p2"], "s3": ["p3"]}}


def inventory(url: str, per_pod: int, ports: int) -> None:
    with session_scope(get_engine(url)) as s:
        s.add_all([Pod(name=p) for p in PODS])
        for pod in PODS:
            for d in range(per_pod):
                s.add(Device(name=f"{pod}-leaf{d}", kind="switch", role="leaf", pod=pod, gpus=0,
                             ports=[Port(name=f"swp{i}") for i in range(ports)]))


def samples(per_pod: int, ports: int, minutes: int) -> list[Sample]:
    t0 = int(T0.timestamp() * 1000)
    return [Sample(METRIC, float(k * 1000 * (d + 1)), t0 + k * 10_000, f"{pod}-leaf{d}", f"swp{i}")
            for pod in PODS for d in range(per_pod) for i in range(ports) for k in range(minutes * 6)]


def shards_asked(control_url: str, topo: Topology, device: str, end: datetime) -> list[str]:
    """The foreign servers one device's read opened a connection to, in a session that held none before
    and has the plan cache's generic plans forced (what a session running the same statements often may
    get)."""
    from sqlalchemy import text

    with get_engine(control_url).connect() as conn:
        conn.execute(text("SELECT postgres_fdw_disconnect_all()"))
        conn.execute(text("SET plan_cache_mode = force_generic_plan"))
        try:
            fleet.query_series(conn=conn, topology=topo, metric=METRIC, start=T0, end=end, device=device)
            return sorted(conn.execute(text("SELECT server_name FROM postgres_fdw_get_connections()")).scalars())
        finally:
            conn.rollback()
            conn.execute(text("RESET plan_cache_mode"))
            conn.commit()


def timed(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    fn()  # warm: connections, plans, the shards' caches
    runs, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices-per-pod", type=int, default=16)
    ap.add_argument("--ports", type=int, default=8)
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    batch = samples(args.devices_per_pod, args.ports, args.minutes)
    end = T0 + timedelta(minutes=args.minutes)
    one_device = f"p2-leaf{args.devices_per_pod - 1}"
    print(f"{len(batch)} samples, {len(PODS) * args.devices_per_pod * args.ports} series, {len(PODS)} pods")
    servers = [PgServer(n) for n in ("control", "s1", "s2", "s3")]
    try:
        for s in servers:
            s.start()
        control, shard_servers = servers[0], dict(zip(("s1", "s2", "s3"), servers[1:], strict=True))

        # the baseline: one server, no shards
        base_url = control.create_database("single")
        upgrade(base_url)
        inventory(base_url, args.devices_per_pod, args.ports)
        t = time.perf_counter()
        with get_engine(base_url).begin() as conn:
            ing = Ingestor(conn)
            for smp in batch:
                ing.add(smp)
            ing.finish()
        ingest_s = time.perf_counter() - t

        def base_read(device: str | None = None) -> list:  # type: ignore[type-arg]
            with get_engine(base_url).connect() as conn:
                return query_series(conn=conn, metric=METRIC, start=T0, end=end, device=device,
                                    level_after_s=(1e9, 1e9))

        read_s, expected = timed(base_read, args.repeat)
        dev_s, _ = timed(lambda: base_read(one_device), args.repeat)
        print(f"single server: ingest {ingest_s:.2f} s ({len(batch) / ingest_s:,.0f}/s), "
              f"read all {read_s * 1000:.0f} ms, one device {dev_s * 1000:.1f} ms")
        want = {(r.device, r.port): r.points for r in expected}  # type: ignore[attr-defined]

        for n, layout in LAYOUTS.items():
            control_url = control.create_database(f"control_n{n}")
            upgrade(control_url)
            inventory(control_url, args.devices_per_pod, args.ports)
            urls = {name: shard_servers[name].url(f"shard_n{n}") for name in layout}
            topo = Topology.of(control_url, ShardSettings(urls=urls, pods=layout))
            apply(topo)
            t = time.perf_counter()
            report = ingest_samples(control=get_engine(control_url), topology=topo, samples=batch)
            ingest_s = time.perf_counter() - t
            assert report.written == len(batch) and not report.errors, report

            def read(device: str | None = None, url: str = control_url, topo: Topology = topo) -> list:  # type: ignore[type-arg]
                with get_engine(url).connect() as conn:
                    return fleet.query_series(conn=conn, topology=topo, metric=METRIC, start=T0, end=end,
                                              device=device)[0]

            read_s, got = timed(read, args.repeat)
            dev_s, _ = timed(lambda read=read: read(one_device), args.repeat)
            have = {(r.device, r.port): r.points for r in got}  # type: ignore[attr-defined]
            assert have == want, f"{n} shards: the fleet read differs from the single server's"
            asked = shards_asked(control_url, topo, one_device, end)
            assert len(asked) == 1, f"{n} shards: one device's read asked {asked}"
            print(f"{n} shard(s): ingest {ingest_s:.2f} s ({len(batch) / ingest_s:,.0f}/s), read all "
                  f"{read_s * 1000:.0f} ms, one device {dev_s * 1000:.1f} ms (same points as the single server; "
                  f"the device's read asked {', '.join(asked)} only)")
    finally:
        for s in servers:
            s.remove()


if __name__ == "__main__":
    main()
