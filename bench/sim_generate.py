"""Simulator benchmark: topology build at 100k GPUs; generation rate and peak memory for 512 hosts.

Usage: python bench/sim_generate.py [--hours H] [--out DIR]
       python bench/sim_generate.py --store [--days D] [--database-url URL]
The 30-day run is projected from a shorter measured range (generation cost is linear in steps).

--store: a 64-host fabric at 60 s straight into the store (`sim generate --store`), into a fresh database
on the server at URL (default $FABRICWATCH_DATABASE_URL), dropped afterwards: samples/s, size on disk
(sample_chunks with TOAST and indexes), wall time, the estimate beside what was stored, and the anchor:
the text writer's samples/s on the same fabric, measured in the same run.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

from simulator.generate import generate
from simulator.scenarios import Scenario
from simulator.topology import TopologyParams, build_topology_dict, write_inventory


def bench_topology(tmp: Path) -> None:
    p = TopologyParams(shape="three-tier", hosts=12_500, pods=8, hosts_per_leaf=32, spines=16,
                       uplinks_per_leaf=16, cores=32)
    t = time.perf_counter()
    inv = build_topology_dict(p)
    build = time.perf_counter() - t
    t = time.perf_counter()
    write_inventory(inv, tmp / "inv100k.yaml")
    write = time.perf_counter() - t
    size = (tmp / "inv100k.yaml").stat().st_size / 1e6
    print(f"topology 100k GPUs: {len(inv['devices']):,} devices, {len(inv['links']):,} links; "
          f"build {build:.1f} s, YAML write {write:.1f} s ({size:.0f} MB)")


def bench_generate(tmp: Path, hours: float) -> None:
    sc = Scenario.model_validate({
        "name": "bench-512", "seed": 1,
        "topology": {"hosts": 512, "hosts_per_leaf": 32, "spines": 16, "host_speed_gbps": 400,
                     "fabric_speed_gbps": 800},
        "faults": [{"type": "dirty_connector", "device": "leaf-p1-r0-01", "port": "Ethernet1/1", "at": "10m"}],
    })
    r = generate(sc, "2025-01-01T00:00:00Z", f"{hours}h", "60s", tmp / "gen")
    rate = r.samples / r.seconds
    size = r.metrics_file.stat().st_size
    steps_30d = 30 * 86400 / 60
    proj_s = r.seconds / r.steps * steps_30d
    print(f"generate 512 hosts: {r.ports:,} ports, {r.series:,} series/step; {r.steps} steps in {r.seconds:.1f} s "
          f"= {rate:,.0f} samples/s, {r.seconds / r.steps * 1000:.0f} ms/step")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # tracemalloc would slow the run 5x
    print(f"  peak RSS of the whole process (incl. the 100k-GPU topology above) {rss:.0f} MB")
    print(f"  projected 30 d @ 60 s: {steps_30d:.0f} steps, {r.series * steps_30d:.2e} samples, "
          f"{proj_s / 60:.0f} min, {size / r.steps * steps_30d / 1e9:.0f} GB uncompressed")


def bench_store(days: float, url: str) -> None:
    import os
    import uuid

    import psycopg
    from sqlalchemy import make_url

    from service.db import dispose_engines, get_engine
    from service.migrate import upgrade
    from simulator.store_writer import StoreEstimate, generate_into_store

    sc = Scenario.model_validate({
        "name": "bench-64", "seed": 1, "topology": {"hosts": 64, "hosts_per_leaf": 32},
        "faults": [{"type": "dirty_connector", "device": "leaf-p1-r0-01", "port": "Ethernet1/1", "at": "10m"}],
    })
    admin = make_url(url).set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    name = f"fw_bench_simstore_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    target = make_url(url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(target)
        tmp = Path(tempfile.mkdtemp(prefix="simbench-"))
        try:  # the anchor: the text writer on the same fabric, 1 hour
            text = generate(sc, "2025-01-01T00:00:00Z", "1h", "60s", tmp / "gen")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        text_rate = text.samples / text.seconds
        seen: list[StoreEstimate] = []
        t = time.perf_counter()
        def report(steps: int, samples: int) -> None:  # a line a simulated day, to follow a long run
            if steps % 1440 == 0:
                print(f"  ... {steps // 1440} d, {samples:,} samples, {time.perf_counter() - t:.0f} s", flush=True)

        r = generate_into_store(get_engine(target), sc, "2025-01-01T00:00:00Z", f"{days * 24:g}h", "60s",
                                confirm=lambda e: seen.append(e) or True, progress=report)
        wall = time.perf_counter() - t
        with psycopg.connect(target) as conn:
            chunks = conn.execute("SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0), "
                                  "coalesce(sum(pg_relation_size(i.inhrelid)), 0) FROM pg_inherits i "
                                  "WHERE i.inhparent = 'sample_chunks'::regclass").fetchone()
            chunks = (int(chunks[0]), int(chunks[1]))
            n_chunks = conn.execute("SELECT count(*), avg(octet_length(data)) FROM sample_chunks").fetchone()
        (e,) = seen
        rate = r.samples / r.seconds
        print(f"store 64 hosts, {days:g} d @ 60 s: {r.series:,} series, {r.steps:,} steps, {r.samples:,} samples "
              f"in {r.seconds:.0f} s (wall {wall:.0f} s incl. inventory and series) = {rate:,.0f} samples/s")
        print(f"  on disk: sample_chunks {chunks[0] / 1e6:.1f} MB with TOAST and indexes "
              f"({chunks[0] / r.samples:.2f} B/sample; heap alone {chunks[1] / 1e6:.1f} MB); "
              f"{n_chunks[0]:,} chunks, {float(n_chunks[1]):.0f} B of data each on average")
        print(f"  estimate before it started: {e.samples:,} samples, {e.disk_bytes / 1e6:.1f} MB "
              f"({e.bytes_per_sample:.2f} B/sample), {e.seconds:.0f} s; as text {e.text_bytes / 1e9:.1f} GB")
        print(f"  anchor: the text writer, same fabric, same run: {text_rate:,.0f} samples/s; "
              f"store/text = {rate / text_rate:.2f}")
        scale = 30 / days
        print(f"  projected 30 d: {r.samples * scale:.2e} samples, {r.seconds * scale / 3600:.1f} h, "
              f"{chunks[0] * scale / 1e9:.1f} GB on disk (text: {e.text_bytes * scale / 1e12:.2f} TB)")
        print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB; pid {os.getpid()}")
    finally:
        dispose_engines()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--store", action="store_true", help="the store benchmark (64 hosts, --days)")
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--database-url", default=None)
    a = ap.parse_args()
    if a.store:
        import os

        url = a.database_url or os.environ.get("FABRICWATCH_DATABASE_URL")
        if not url:
            raise SystemExit("--store needs --database-url or FABRICWATCH_DATABASE_URL")
        bench_store(a.days, url)
        return
    tmp = a.out or Path(tempfile.mkdtemp(prefix="simbench-"))
    try:
        bench_topology(tmp)
        bench_generate(tmp, a.hours)
    finally:
        if a.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
