"""Shards (#20 item 6): what moving a pod between shards costs (`fabricwatch shards move`), against ingesting the
same history in the same run.

    python bench/shards_move.py [--devices 16] [--ports 16] [--minutes 180] [--batch-series 500]

Starts its own PostgreSQL servers (tests/shards/pg_cluster.py: a control server and two shard servers on
loopback, fsync off) and removes them at the end. Pod p2 (`--devices` switches of `--ports` ports, one counter
per port at 10 s for `--minutes`) is stored on shard b through service/shards/ingest.py (the anchor: the same
samples, the same servers), then moved to shard a (service/shards/rebalance.py). Printed: the ingest's time,
the move's time by step (mark, copy, verify, switch, remove) and its samples per second, and the ratio of the
move to the ingest. Every sample is checked on shard a once and none left on b. All servers share this
machine's cores. Not a test: the figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from service.db import get_engine, session_scope
from service.inventory.models import Device, Pod, Port
from service.migrate import upgrade
from service.shards.ingest import ingest_samples
from service.shards.rebalance import move_pod
from service.shards.setup import apply
from service.shards.topology import ShardSettings, Topology
from service.telemetry.samples import Sample
from tests.shards.pg_cluster import PgServer

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--ports", type=int, default=16)
    ap.add_argument("--minutes", type=int, default=180)
    ap.add_argument("--batch-series", type=int, default=500)
    args = ap.parse_args()
    servers = [PgServer(n) for n in ("control", "a", "b")]
    try:
        for s in servers:
            s.start()
        control = servers[0].create_database("fw_control")
        upgrade(control)
        with session_scope(get_engine(control)) as s:
            s.add_all([Pod(name="p1"), Pod(name="p2")])
            for d in range(args.devices):
                s.add(Device(name=f"p2-leaf{d}", kind="switch", role="leaf", pod="p2", gpus=0,
                             ports=[Port(name=f"swp{i}") for i in range(args.ports)]))
        topo = Topology.of(control, ShardSettings(urls={"a": servers[1].url("fw_shard"),
                                                        "b": servers[2].url("fw_shard")},
                                                  pods={"a": ["p1"], "b": ["p2"]}))
        apply(topo)
        t0 = int(T0.timestamp() * 1000)
        batch = [Sample("port_rx_bytes_total", float(k * 1000), t0 + k * 10_000, f"p2-leaf{d}", f"swp{i}")
                 for d in range(args.devices) for i in range(args.ports) for k in range(args.minutes * 6)]
        started = time.perf_counter()
        for i in range(0, len(batch), 100_000):
            report = ingest_samples(control=get_engine(control), topology=topo, samples=batch[i:i + 100_000])
            assert not report.errors
        ingest_s = time.perf_counter() - started
        steps: dict[str, float] = {}

        def progress(phase: str, done: int, total: int) -> None:
            steps.setdefault(phase, time.perf_counter())

        started = time.perf_counter()
        moved = move_pod(topo, "p2", "a", batch_series=args.batch_series, progress=progress)
        move_s = time.perf_counter() - started
        marks = sorted(steps.items(), key=lambda kv: kv[1])
        with get_engine(servers[1].url("fw_shard")).connect() as conn:
            on_a = conn.execute(text("SELECT count(*), count(DISTINCT (series_id, ts)) FROM sample_rows")).one()
        with get_engine(servers[2].url("fw_shard")).connect() as conn:
            on_b = conn.execute(text("SELECT count(*) FROM sample_rows")).scalar_one()
        assert tuple(on_a) == (len(batch), len(batch)) and on_b == 0, (on_a, on_b)
        n = len(batch)
        print(f"pod p2: {moved.series} series, {n} samples ({args.devices} devices x {args.ports} ports x "
              f"{args.minutes} min at 10 s)")
        print(f"ingest (anchor): {ingest_s:.2f} s, {n / ingest_s:,.0f} samples/s")
        print(f"move: {move_s:.2f} s, {n / move_s:,.0f} samples/s, {move_s / ingest_s:.2f} x the ingest")
        names = ["mark", *(phase for phase, _ in marks)]
        ends = [at for _, at in marks] + [started + move_s]
        prev = started
        for name, end in zip(names, ends, strict=True):  # each step starts with its first progress report
            print(f"  {name}: {end - prev:.2f} s")
            prev = end
    finally:
        for s in servers:
            for db in ("postgres", "fw_control", "fw_shard"):
                get_engine(s.url(db)).dispose()
        for s in servers:
            s.remove()


if __name__ == "__main__":
    main()
