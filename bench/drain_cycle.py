"""Drain recommendations in a live cycle: what each firing page adds to the cycle, by fabric size.

    python bench/drain_cycle.py [--hosts 64 1024] [--pages 1 8 32] [--repeat 3]

Each page of a cycle gets a drain recommendation with a fresh safety verdict (service/drains/service.py). For
each fabric size (a rail-optimized simulator fabric, 8 NICs a host, in a fresh database on the test server),
every port's `port_oper_up` is stored once (a few ports down), then `apply_cycle` runs on K firing pages on K
hosts' ports, in a transaction rolled back after each run, so every run starts from the same database.
Printed: the cycle's wall time for 0 pages (the anchor: the alerts of the same findings at ticket severity, no
drain) and for each K, medians of `--repeat` runs, and the marginal cost of a page,
(t(K_max) - t(K_min)) / (K_max - K_min). Not a test: the figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

T0_MS = 1_790_000_000_000


def _url(server: str, name: str) -> str:
    return server.rsplit("/", 1)[0] + "/" + name


def build(server: str, hosts: int) -> tuple[str, list[tuple[str, str]]]:
    """A fresh database with a `hosts`-host fabric and every port's oper status; its URL and the host ports."""
    import psycopg
    from sqlalchemy.orm import Session

    from service.db import get_engine
    from service.inventory.schemas import Inventory
    from service.inventory.service import upsert_inventory
    from service.migrate import upgrade
    from service.telemetry.samples import Sample
    from service.telemetry.service import ingest_samples
    from simulator.scenarios import Scenario
    from simulator.telemetry import resolve_inventory

    name = f"fw_drain_bench_{hosts}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    url = _url(server, name)
    upgrade(url)
    engine = get_engine(url)
    sc = Scenario.model_validate({"name": "drain-bench", "seed": 1, "topology": {
        "shape": "rail-optimized", "hosts": hosts, "nics_per_host": 8, "gpus_per_host": 8, "hosts_per_leaf": 32,
        "spines": 8, "optics_mix": {"400G-DR4": 1.0}}, "faults": []})
    inv = Inventory.model_validate(resolve_inventory(sc.inventory_source()))
    with Session(engine) as s:
        upsert_inventory(session=s, inventory=inv)
        s.commit()
    ends = [(d.name, p.name) for d in inv.devices for p in d.ports]
    # every port up a minute before the cycle, every 50th down
    ingest_samples(engine=engine, samples=[Sample("port_oper_up", float(i % 50 != 7), T0_MS - 60_000, dev, port)
                                           for i, (dev, port) in enumerate(ends)])
    host_ports = [(d.name, p.name) for d in inv.devices if d.role == "host" for p in d.ports[:1]]
    return url, host_ports


def one_cycle(url: str, ends: list[tuple[str, str]], pages: int) -> float:
    """Wall seconds of apply_cycle on `pages` firing pages (0: the same findings as tickets), rolled back."""
    from sqlalchemy import text

    from service.db import get_engine
    from service.detection.findings import Action, Cause, Evidence, Finding, Severity
    from service.pipeline import apply_cycle

    n = max(pages, 1)
    findings = [Finding(kind="post_fec_errors", scope="port", device=dev, port=port, lane=None,
                        cause=Cause.POST_FEC, severity=Severity.PAGE if pages else Severity.TICKET,
                        action=Action.REPLACE_CABLE, state="firing", score=3.0, at_ms=T0_MS,
                        summary=f"post-FEC errors on {dev} {port}",
                        evidence=[Evidence("post_fec_rate", 1e-9, baseline=0.0, unit="1/s")])
                for dev, port in ends[:n]]
    with get_engine(url).connect() as conn:
        conn.execute(text("SELECT 1"))  # the pooled connection is open before the clock starts
        conn.commit()
        trans = conn.begin()
        start = time.perf_counter()
        out = apply_cycle(conn, findings, T0_MS)
        took = time.perf_counter() - start
        trans.rollback()
    if len(out.drains) != pages:
        raise SystemExit(f"{pages} pages gave {len(out.drains)} drain recommendations: {out.drain_errors}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--hosts", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--pages", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the databases (dropped by default)")
    args = ap.parse_args()
    import psycopg
    from sqlalchemy import text

    from service.db import dispose_engines, get_engine

    print(f"{platform.node()} {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for hosts in args.hosts:
        url, ends = build(args.server, hosts)
        with get_engine(url).connect() as conn:
            ports = conn.execute(text("SELECT count(*) FROM ports")).scalar_one()
            links = conn.execute(text("SELECT count(*) FROM links")).scalar_one()
        print(f"\n{hosts} hosts: {ports} ports, {links} links")
        one_cycle(url, ends, max(args.pages))  # warm: plans, caches
        medians = {}
        for k in [0, *args.pages]:
            medians[k] = statistics.median(one_cycle(url, ends, k) for _ in range(args.repeat))
            print(f"  {k:3d} pages: {medians[k] * 1000:8.1f} ms a cycle"
                  + (f" ({medians[k] / medians[0]:.1f}x the anchor)" if k else " (the anchor: as tickets, no drain)"))
        lo, hi = min(args.pages), max(args.pages)
        per_page = (medians[hi] - medians[lo]) / (hi - lo)
        print(f"  a page adds {per_page * 1000:.1f} ms ({per_page / medians[0]:.2f}x the anchor)")
        dispose_engines()
        if not args.keep:
            with psycopg.connect(args.server, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "fw_drain_bench_{hosts}" WITH (FORCE)')
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
