"""Shards (#20): the import's CPU per sample, single server against two shards, and one code tree against
another, side by side in one run (process CPU time, not wall time: the machine is shared).

    python bench/shards_import_cpu.py [--before /tmp/old-checkout] [--rounds 2] [--intervals 3]

Starts its own PostgreSQL 15 servers (tests/shards/pg_cluster.py): a control server and two shard servers,
removed at the end. The fabric is a part of bench/ingest_soak.py's (64 hosts, 16 leaves, 8 spines: 2,048
ports, 81,920 series), in two pods of equal size (p1 on shard s1, p2 on s2). Each phase gets fresh
databases and a process of its own, with the code of one tree (`--before`, and this checkout), that pushes
every device's exposition through what `POST /api/v1/import/prometheus` calls (`import_prometheus` on one
server, `shards.ingest.import_exposition` with shards): one interval that creates the series, then
`--intervals` intervals measured: the process's CPU time (every thread, the Ingestors' workers included)
around the import calls only, per sample stored. PostgreSQL's CPU is not counted. Not a test: the figures
go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOSTS, LEAVES, SPINES = 64, 16, 8


def pod_of(device: str) -> str:
    kind, num = device.rsplit("-", 1)
    half = {"gpu": HOSTS // 2, "leaf": LEAVES // 2, "spine": SPINES // 2}[kind]
    return "p1" if int(num) < half else "p2"


def worker(args: argparse.Namespace) -> None:
    """One phase, in its own process with one tree's code on sys.path: prints a JSON line."""
    sys.path.insert(0, str(REPO / "bench"))
    from ingest_soak import INTERVAL_S, Exposition, fabric

    from service.db import get_engine

    devices = fabric(HOSTS, LEAVES, SPINES)
    expos = [Exposition(d, role, ports, seed=i) for i, (d, role, ports) in enumerate(devices)]
    engine = get_engine(args.control)
    if args.shards:
        from service.shards.ingest import import_exposition
        from service.shards.topology import ShardSettings, Topology

        settings = ShardSettings(urls=json.loads(args.shards), pods=json.loads(args.pods))
        topology = Topology.of(args.control, settings)

        def push(body: bytes) -> int:
            return import_exposition(control=engine, topology=topology, chunks=[body], source="body",
                                     default_ts_ms=0)[0].written
    else:
        from service.telemetry.service import import_prometheus

        def push(body: bytes) -> int:
            return import_prometheus(engine=engine, chunks=[body], source="body").written

    step = int(INTERVAL_S * 1000)
    t0 = int(time.time() * 1000) - (args.intervals + 2) * step
    cpu = wall = 0.0
    written = 0
    for k in range(args.intervals + 1):
        bodies = [e.text(t0 + k * step).encode() for e in expos]  # not measured
        c0, w0 = time.process_time(), time.perf_counter()
        n = sum(push(b) for b in bodies)
        if k:  # the first interval creates the series
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            written += n
    import service

    print(json.dumps({"written": written, "cpu_s": cpu, "wall_s": wall, "code": str(Path(service.__file__).parent)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="another checkout (the code before a change), measured alongside this one")
    ap.add_argument("--rounds", type=int, default=2, help="times through the phases (alternating order)")
    ap.add_argument("--intervals", type=int, default=3, help="intervals measured per phase")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--control", help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    ap.add_argument("--pods", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    import psycopg

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from ingest_soak import fabric, port_name

    from service.migrate import upgrade
    from service.shards.setup import apply
    from service.shards.topology import ShardSettings, Topology
    from tests.shards.pg_cluster import PgServer

    devices = fabric(HOSTS, LEAVES, SPINES)
    trees = ([("before", Path(args.before).resolve())] if args.before else []) + [("after", REPO)]
    servers = {n: PgServer(n) for n in ("control", "s1", "s2")}
    phases = [(tree, layout) for tree in trees for layout in ("single", "2 shards")]
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {len(devices)} devices, "
          f"{sum(p for _, _, p in devices) * 40:,} series; {args.intervals} intervals measured per phase")
    try:
        for s in servers.values():
            s.start()
        for r in range(args.rounds):
            for i, ((name, tree), layout) in enumerate(phases if r % 2 == 0 else phases[::-1]):
                tag = f"r{r}_{i}"
                control = servers["control"].create_database(f"ctl_{tag}")
                upgrade(control)
                with psycopg.connect(control) as c:
                    c.execute("INSERT INTO pods (name) VALUES ('p1'), ('p2')")
                    for dev, role, ports in devices:
                        kind = "host" if role == "host" else "switch"
                        did = c.execute("INSERT INTO devices (name, kind, role, gpus, pod) VALUES (%s, %s, %s, "
                                        "%s, %s) RETURNING id", (dev, kind, role, 8 if kind == "host" else 0,
                                                                 pod_of(dev))).fetchone()[0]  # type: ignore[index]
                        c.cursor().executemany("INSERT INTO ports (device_id, name) VALUES (%s, %s)",
                                               [(did, port_name(role, p)) for p in range(ports)])
                cmd = [sys.executable, str(REPO / "bench/shards_import_cpu.py"), "--worker", "--control", control,
                       "--intervals", str(args.intervals)]
                urls: dict[str, str] = {}
                if layout != "single":
                    urls = {"s1": servers["s1"].url(f"sh_{tag}"), "s2": servers["s2"].url(f"sh_{tag}")}
                    pods = {"s1": ["p1"], "s2": ["p2"]}
                    apply(Topology.of(control, ShardSettings(urls=urls, pods=pods)))
                    cmd += ["--shards", json.dumps(urls), "--pods", json.dumps(pods)]
                load = os.getloadavg()[0]
                try:
                    done = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                          capture_output=True, text=True)
                    if done.returncode:
                        raise SystemExit(f"{name} {layout}: the phase failed:\n{done.stderr[-3000:]}")
                    out = done.stdout
                finally:
                    for url in [control, *urls.values()]:
                        server, db = url.rsplit("/", 1)
                        with psycopg.connect(f"{server}/postgres", autocommit=True) as c:
                            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                got = json.loads(out.strip().splitlines()[-1])
                print(f"{name:6s} {layout:8s} (load {load:4.1f}): {got['written']:,} samples, "
                      f"{got['cpu_s']:.2f} CPU s ({got['cpu_s'] / got['written'] * 1e6:.1f} us/sample), "
                      f"{got['wall_s']:.1f} s wall; code of {got['code']}", flush=True)
    finally:
        for s in servers.values():
            s.remove()


if __name__ == "__main__":
    main()
