"""API under load while ingest runs: p50/p99 of /api/v1/alerts and /api/v1/series at fixed request rates.

    python bench/load.py [--rates 100,500] [--seconds 20] [--ingest-devices 76] [--workers 2] [--revalidate]

Open loop: request i is sent at t0 + i / rate whether or not earlier ones have answered, and its
latency is measured from that intended time, so a server that falls behind shows it (no
coordinated omission). Each rate runs for a bounded time (`--seconds`), requests time out after
10 s, loopback only. Meanwhile a Prometheus-text ingest stream pushes every 10 s for part of the
4,096-GPU fabric of bench/ingest_soak.py (`--ingest-devices`; all 608 is ~41k samples/s).

The request mix: alerts (first page, and filtered by device) and series (one port's rx rate
over the last hour from raw samples, and over 3 days from the 5m rollups). Seeded: 2,000 alerts,
and 3 days of 1-minute history for 8 hosts' ports, rolled up, then ANALYZEd (as autovacuum would
soon after such a load). Not a test.

Anchor, in the same run: before each rate's mix, `GET /healthz` alone at the same rate (no database,
no auth): what the machine, the framework and this load generator give at that rate with nothing to
compute. The machine is shared: each phase prints the CPU the API processes and their database
backends used per request, and how busy the whole machine was (the rest is other work).

`--revalidate`: alert requests send If-None-Match with the ETag last seen for the same query, as a
browser or the NOC page polling the list does; 304s count as answers.

`--kinds-rate R`: after the mix, each of the mix's four request kinds alone at R req/s for `--kinds-seconds`,
after a phase with no requests (ingest only): CPU ms per request of each kind, API + its database, less
that idle phase. `--baseline-dir DIR` serves DIR's code (a `git archive` of an older commit) on the next port
against the same database, measured the same way, alternating with this code, kind by kind: a side-by-side
in one run on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import psutil
from ingest_soak import (  # bench scripts share the fabric; they are not a package
    REPO,
    CpuMeter,
    PushStats,
    add_inventory,
    api_server,
    backends,
    create_db,
    drop_db,
    fabric,
    proc_tree,
    push_loop,
)

HISTORY_HOSTS = 8


def seed(url: str) -> None:
    """2,000 alerts and 3 days of port_rx_bytes_total for 8 hosts, rolled up to 5m/1h."""
    now_ms = int(time.time() * 1000)
    with psycopg.connect(url) as c:
        c.execute(
            "INSERT INTO alerts (fingerprint, kind, scope, device, port, state, severity, cause, action, summary, "
            "score, evidence, members, missed_cycles, notified, episode, first_opened_at_ms, opened_at_ms, "
            "last_seen_ms) SELECT 'fp-' || i, 'link_flap', 'port', 'gpu-' || lpad((i %% 512)::text, 4, '0'), "
            "'eth' || (i %% 8), (ARRAY['firing','acknowledged','resolved'])[1 + i %% 3], "
            "(ARRAY['critical','warning','info'])[1 + i %% 3], 'optics', 'replace_optic', 'bench alert ' || i, "
            "i %% 100, '[]'::jsonb, '[]'::jsonb, 0, false, 1, %(t)s - i * 60000, %(t)s - i * 60000, %(t)s "
            "FROM generate_series(1, 2000) i", {"t": now_ms})
    sys.path.insert(0, str(REPO))
    from service.db import get_engine
    from service.telemetry.samples import Sample
    from service.telemetry.service import ingest_samples

    engine = get_engine(url)
    start = int(time.time()) // 60 * 60 - 3 * 86400
    rng = random.Random(1)
    for h in range(HISTORY_HOSTS):
        vals = [0.0] * 8
        batch = []
        for i in range(3 * 1440):
            for p in range(8):
                vals[p] += rng.randrange(10**9, 10**10)
                batch.append(Sample("port_rx_bytes_total", vals[p], (start + i * 60) * 1000, f"gpu-{h:04d}",
                                    f"eth{p}"))
        ingest_samples(engine=engine, samples=batch)
    from service.telemetry.rollups import run_rollups

    run_rollups(engine, now=datetime.now(UTC), max_chunks=10_000)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ANALYZE")


KINDS = ("alerts first page", "alerts of a device", "series 1 h raw", "series 3 days")


def request_for(i: int, rng: random.Random, kind: int | None = None) -> tuple[str, str, dict[str, str]]:
    """Request i of the mix (kind i % 4), or of one kind only."""
    now = datetime.now(UTC)
    dev, port = f"gpu-{rng.randrange(HISTORY_HOSTS):04d}", f"eth{rng.randrange(8)}"
    kind = i % 4 if kind is None else kind
    if kind == 0:
        return "alerts", "/api/v1/alerts", {"limit": "100"}
    if kind == 1:
        return "alerts", "/api/v1/alerts", {"device": f"gpu-{rng.randrange(512):04d}", "state": "firing"}
    if kind == 2:
        return "series", "/api/v1/series", {"metric": "port_rx_bytes_total", "device": dev, "port": port,
                                            "start": (now - timedelta(hours=1)).isoformat()}
    return "series", "/api/v1/series", {"metric": "port_rx_bytes_total", "device": dev, "port": port,
                                        "start": (now - timedelta(days=3)).isoformat()}


async def open_loop(base: str, rate: float, seconds: float, *, anchor: bool = False,
                    revalidate: bool = False, kind: int | None = None) -> dict[str, list[float]]:
    """Latency (s, from intended send time) per endpoint; a failure or timeout counts as 10 s.
    `anchor`: every request is GET /healthz. `revalidate`: alert requests send the last ETag of their query.
    `kind`: only that kind of the mix's requests; a rate of 0 sends nothing for `seconds`."""
    if rate <= 0:
        await asyncio.sleep(seconds)
        return {"errors": []}
    out: dict[str, list[float]] = {"alerts": [], "series": [], "healthz": [], "errors": [], "not_modified": []}
    rng = random.Random(int(rate))
    etags: dict[str, str] = {}
    # aiohttp, not httpx: measured here, httpx's client costs ~1.0 CPU ms per request and aiohttp's ~0.23,
    # CPU the server on the same two cores would otherwise lose to its own load generator.
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(base, timeout=timeout, connector=aiohttp.TCPConnector(limit=512)) as client:
        async def one(i: int, due: float) -> None:
            name, path, params = ("healthz", "/healthz", {}) if anchor else request_for(i, rng, kind)
            key = f"{path}?{sorted(params.items())}"
            headers = {"if-none-match": etags[key]} if revalidate and key in etags else {}
            try:
                async with client.get(path, params=params, headers=headers) as r:
                    await r.read()
                    ok = r.status in (200, 304)
                    if r.status == 304:
                        out["not_modified"].append(1.0)
                    if "etag" in r.headers:
                        etags[key] = r.headers["etag"]
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            out[name].append(time.perf_counter() - due if ok else 10.0)
            if not ok:
                out["errors"].append(1.0)

        t0 = time.perf_counter()
        tasks = []
        for i in range(int(rate * seconds)):
            due = t0 + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(i, due)))
        await asyncio.gather(*tasks)
    return out


class Phase:
    """CPU used during one phase: the API processes and the bench database's backends (per pid), and the
    whole machine (psutil.cpu_times: all processes, other work on the machine included)."""

    def __init__(self, server: Any, db_url: str) -> None:
        self.server, self.db_url, self.meter = server, db_url, CpuMeter()

    def __enter__(self) -> Phase:
        self.meter.sample(proc_tree(self.server) + backends(self.db_url))
        self.t0, self.m0 = time.monotonic(), psutil.cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        self.meter.sample(proc_tree(self.server) + backends(self.db_url))
        m1 = psutil.cpu_times()
        self.wall = time.monotonic() - self.t0
        busy = (m1.user + m1.nice + m1.system + m1.irq + m1.softirq) - \
            (self.m0.user + self.m0.nice + self.m0.system + self.m0.irq + self.m0.softirq)
        self.machine_cores = busy / self.wall
        self.api_cores = self.meter.seconds() / self.wall


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000 if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="100,500")
    ap.add_argument("--seconds", type=float, default=20.0, help="per rate")
    ap.add_argument("--ingest-devices", type=int, default=76, help="devices pushing every 10 s (608 = all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--revalidate", action="store_true", help="alert requests send If-None-Match")
    ap.add_argument("--app-dir", type=Path, default=REPO,
                    help="serve another checkout's code (e.g. `git archive` of the commit before a change)")
    ap.add_argument("--kinds-rate", type=float, default=0.0, help="each kind alone at this rate (0: not run)")
    ap.add_argument("--kinds-seconds", type=float, default=10.0)
    ap.add_argument("--baseline-dir", type=Path, help="older code, measured kind by kind beside this one")
    ap.add_argument("--port", type=int, default=18432)
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    devices = fabric()
    url = create_db(args.server, "fw_load")
    results: dict[tuple[float, str], tuple[dict[str, list[float]], Phase]] = {}
    kinds: list[tuple[str, str, float, Phase, dict[str, list[float]]]] = []
    try:
        add_inventory(url, devices)
        seed(url)
        base = f"http://127.0.0.1:{args.port}"
        with api_server(url, args.port, args.workers, args.app_dir) as server, contextlib.ExitStack() as more:
            servers = [(str(args.app_dir), server, base)]
            if args.baseline_dir:
                b = f"http://127.0.0.1:{args.port + 1}"
                servers.append((str(args.baseline_dir),
                                more.enter_context(api_server(url, args.port + 1, args.workers, args.baseline_dir)), b))
            pushers = devices[:args.ingest_devices]
            ingest = PushStats()
            total = 2 * args.seconds * len(rates) + 40
            if args.kinds_rate:
                total += (len(KINDS) + 2) * len(servers) * (args.kinds_seconds + 3)
            t = threading.Thread(target=lambda: asyncio.run(
                push_loop(base, pushers, time.monotonic() + total, ingest, 8)), daemon=True)
            t.start()
            time.sleep(12)  # the stream's first interval creates its series; measure in steady state
            for r in rates:
                for what in ("anchor", "mix"):
                    with Phase(server, url) as phase:
                        res = asyncio.run(open_loop(base, r, args.seconds, anchor=what == "anchor",
                                                    revalidate=args.revalidate))
                    results[(r, what)] = (res, phase)
                    time.sleep(2)  # let a backlog drain before the next phase
            if args.kinds_rate:
                kind_phases(args, url, servers, kinds)
            t.join()
        n_ports = sum(p for _, _, p in pushers)
        print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}; "
              f"{args.workers} uvicorn workers serving {args.app_dir}, load generator on the same machine; "
              f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"ingest stream  : {len(pushers)} devices, {n_ports * 40 / 10:,.0f} samples/s offered, "
              f"{ingest.written:,} written, {ingest.errors} errors, push p50 {pct(ingest.latencies, 0.5):.0f} ms")
        for (r, what), (res, phase) in results.items():
            names = ("healthz",) if what == "anchor" else ("alerts", "series")
            for name in names:
                xs = res[name]
                print(f"{r:5.0f} req/s  {name:7s}: n={len(xs):5d}  p50 {pct(xs, 0.5):7.1f} ms  "
                      f"p99 {pct(xs, 0.99):7.1f} ms  max {pct(xs, 1.0):7.1f} ms")
            n = sum(len(res[x]) for x in names)
            print(f"{r:5.0f} req/s  {what}: errors/timeouts {len(res['errors'])}, 304s {len(res['not_modified'])}; "
                  f"API + its database {1000 * phase.api_cores * phase.wall / n:.2f} CPU ms/request "
                  f"(ingest included), {phase.api_cores:.2f} cores over {phase.wall:.0f} s; machine busy "
                  f"{phase.machine_cores:.2f} of {os.cpu_count()} cores")
        report_kinds(args, kinds)
    finally:
        drop_db(args.server, url)


def kind_phases(args: argparse.Namespace, url: str, servers: list[tuple[str, Any, str]],
                out: list[tuple[str, str, float, Phase, dict[str, list[float]]]]) -> None:
    """Idle (ingest only), each kind alone, idle again; servers alternate phase by phase."""
    plan = [("idle", None, 0.0), *((k, i, args.kinds_rate) for i, k in enumerate(KINDS)), ("idle", None, 0.0)]
    for name, kind, rate in plan:
        for app_dir, server, base in servers:
            # Warm up: each process fills its pool and caches (a cache's first fill is not its steady state).
            if rate:
                asyncio.run(open_loop(base, rate, 1.0, kind=kind))
            with Phase(server, url) as phase:
                res = asyncio.run(open_loop(base, rate, args.kinds_seconds, kind=kind))
            out.append((app_dir, name, rate, phase, res))
            time.sleep(2)


def report_kinds(args: argparse.Namespace, kinds: list[tuple[str, str, float, Phase, dict[str, list[float]]]]
                 ) -> None:
    if not kinds:
        return
    print(f"each kind alone at {args.kinds_rate:.0f} req/s for {args.kinds_seconds:.0f} s; CPU of API + its database "
          "per request, less the mean of the idle phases (ingest only) of the same code:")
    for app_dir in dict.fromkeys(a for a, *_ in kinds):
        mine = [k for k in kinds if k[0] == app_dir]
        idle = [ph.api_cores for _, name, _, ph, _ in mine if name == "idle"]
        idle_cores = sum(idle) / len(idle)
        print(f"  {app_dir}: idle {idle_cores:.3f} cores ({', '.join(f'{c:.3f}' for c in idle)})")
        for _, name, _, ph, res in mine:
            if name == "idle":
                continue
            xs = res.get("alerts", []) + res.get("series", [])
            per = 1000 * (ph.api_cores - idle_cores) * ph.wall / max(1, len(xs))
            print(f"    {name:20s}: {per:6.2f} CPU ms/request; n={len(xs)} p50 {pct(xs, 0.5):6.1f} ms "
                  f"p99 {pct(xs, 0.99):7.1f} ms, errors {len(res['errors'])}; machine busy "
                  f"{ph.machine_cores:.2f} cores")


if __name__ == "__main__":
    main()
