"""API under load while ingest runs: p50/p99 of /api/v1/alerts and /api/v1/series at fixed request rates.

    python bench/load.py [--rates 100,500] [--seconds 20] [--ingest-devices 76] [--workers 2] [--no-revalidate]
                         [--client lean|aiohttp] [--warmup 5] [--alert-writes 10]

`--warmup S`: each phase's requests are sent for S seconds first and their latencies printed apart: a worker's
first seconds under load fill its caches (docs/benchmarks.md, 2026-12-05), and the figures after it are the
steady state. `--alert-writes S`: during the mix an alert is written every S seconds, as a detection cycle
does, so the alert pages the workers hold go stale and are rendered again.

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

Alert requests send If-None-Match with the ETag last seen for the same query, as a browser or the NOC
page polling the list does (304s count as answers, and are printed as such); `--no-revalidate` sends none,
as this bench did before 2026-12-03 (every alert request a 200 with its page: 77 KB for the first page).

The generator: one asyncio loop (uvloop) and bench/lean_http.py's keep-alive client, which costs about half
of aiohttp's CPU per request (`--client aiohttp`: the one used before 2026-12-03). Each phase prints the
generator's own CPU per request (its thread's CPU time): it runs on the same cores as the server. And its
process's garbage collections in the phase (count, total and longest pause): a pause is latency the server
did not cause. What the process holds after seeding is frozen (gc.freeze), so they stay short.

Where the server's time goes: bench/api_trace (a `sitecustomize` that traces each worker's requests, thread-pool
calls, collections and event-loop stalls; its docstring says how to run it and read the result).

`--kinds N`: after the mix, each of the mix's four request kinds alone, N requests two at a time
(closed loop, so a busy machine delays them but does not pile them up), `--kinds-rounds` times: CPU ms per
request of each kind, API + its database, after the ingest stream has stopped (less what the idle phases
before and after measure: background work). `--baseline-dir DIR` serves DIR's code (a `git archive` of an
older commit) on the next port against the same database, measured the same way, alternating with this
code kind by kind: a side-by-side in one run on one machine, whatever else the machine is doing. The rate
phases (anchor and mix) run on both too, this code first at each rate, the ingest stream pushing to the one
being measured; the idle server's connections stay open, so its backends are in the other's figures (idle,
they cost nothing measurable).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
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
import uvloop
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
from lean_http import LeanClient, RequestFailed

HISTORY_HOSTS = 8
# With bench/api_trace on PYTHONPATH and FWTRACE_DIR set: each request's (kind, intended send time, latency),
# written to FWTRACE_DIR/client.json at the end (perf_counter times, comparable with the workers' traces).
TRACE: list[tuple[str, float, float]] | None = [] if os.environ.get("FWTRACE_DIR") else None


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
                    revalidate: bool = True, kind: int | None = None, client: str = "lean",
                    cpu: list[float] | None = None) -> dict[str, list[float]]:
    """Latency (s, from intended send time) per endpoint; a failure or timeout counts as 10 s.
    `anchor`: every request is GET /healthz. `revalidate`: alert requests send the last ETag of their query.
    `kind`: only that kind of the mix's requests. `client`: "lean" (bench/lean_http.py) or "aiohttp".
    `cpu`: gets the CPU seconds this thread (the generator's event loop) used, appended."""
    out: dict[str, list[float]] = {"alerts": [], "series": [], "healthz": [], "errors": [], "not_modified": []}
    rng = random.Random(int(rate))
    etags: dict[str, str] = {}
    c0 = time.thread_time()
    async with contextlib.AsyncExitStack() as stack:
        if client == "lean":
            host, _, port = base.removeprefix("http://").partition(":")
            lean = await stack.enter_async_context(LeanClient(host, int(port), limit=512, timeout_s=10))

            async def get(path: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, str | None]:
                answer = await lean.get(LeanClient.target(path, params), headers)
                return answer.status, answer.etag
        else:
            # aiohttp, not httpx: measured here, httpx's client costs ~1.0 CPU ms per request and aiohttp's
            # ~0.23-0.6 (the lean client less still: its docstring).
            session = await stack.enter_async_context(aiohttp.ClientSession(
                base, timeout=aiohttp.ClientTimeout(total=10), connector=aiohttp.TCPConnector(limit=512)))

            async def get(path: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, str | None]:
                async with session.get(path, params=params, headers=headers) as r:
                    await r.read()
                    return r.status, r.headers.get("etag")

        async def one(i: int, due: float) -> None:
            name, path, params = ("healthz", "/healthz", {}) if anchor else request_for(i, rng, kind)
            key = f"{path}?{sorted(params.items())}"
            headers = {"If-None-Match": etags[key]} if revalidate and key in etags else {}
            try:
                status, etag = await get(path, params, headers)
                ok = status in (200, 304)
                if status == 304:
                    out["not_modified"].append(1.0)
                if etag:
                    etags[key] = etag
            except (aiohttp.ClientError, RequestFailed, OSError, TimeoutError):
                ok = False
            out[name].append(time.perf_counter() - due if ok else 10.0)
            if TRACE is not None:
                TRACE.append((name, due, out[name][-1]))
            if not ok:
                out["errors"].append(1.0)

        t0 = time.perf_counter()
        # Only the requests in flight are kept (a set, as asyncio's docs advise): holding every finished task
        # until the end grew the generator's heap, and with it what each of its collections scans.
        pending: set[asyncio.Task[None]] = set()
        for i in range(int(rate * seconds)):
            due = t0 + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            task = asyncio.create_task(one(i, due))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    if cpu is not None:
        cpu.append(time.thread_time() - c0)
    return out


class AlertWriter(threading.Thread):
    """Every `every_s` seconds (0: never), one alert's last_seen moved as a detection cycle does: the alert
    list's version moves, and every page the workers hold is stale (each query's next request renders)."""

    def __init__(self, url: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s, self.done = url, every_s, threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            while not self.done.wait(self.every_s):
                c.execute("UPDATE alerts SET last_seen_ms = %s WHERE id = (SELECT min(id) FROM alerts)",
                          (int(time.time() * 1000),))

    def __enter__(self) -> AlertWriter:
        if self.every_s:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()


class Phase:
    """CPU used during one phase: the API processes and the bench database's backends (per pid), and the
    whole machine (psutil.cpu_times: all processes, other work on the machine included)."""

    def __init__(self, server: Any, db_url: str) -> None:
        self.server, self.db_url, self.meter = server, db_url, CpuMeter()
        self.generator_s = 0.0  # the load generator's thread, when the phase measures it
        # This process's garbage collections (the generator's and the ingest thread's): each holds the GIL, so the
        # generator neither sends nor reads meanwhile, and its requests' latency grows by as much.
        self.gc_pauses: list[float] = []
        self._gc_t0 = 0.0

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_pauses.append(time.perf_counter() - self._gc_t0)

    def __enter__(self) -> Phase:
        self.meter.sample(proc_tree(self.server) + backends(self.db_url))
        self.t0, self.m0 = time.monotonic(), psutil.cpu_times()
        gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._gc)
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
    ap.add_argument("--no-revalidate", dest="revalidate", action="store_false",
                    help="alert requests send no If-None-Match (each gets its whole page)")
    ap.add_argument("--alert-writes", type=float, default=0.0,
                    help="during the mix, an alert written every this many seconds (as a detection cycle does)")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds of each phase's requests sent first and not counted")
    ap.add_argument("--client", choices=("lean", "aiohttp"), default="lean", help="the generator's HTTP client")
    ap.add_argument("--app-dir", type=Path, default=REPO,
                    help="serve another checkout's code (e.g. `git archive` of the commit before a change)")
    ap.add_argument("--kinds", type=int, default=0, help="requests of each kind alone per round (0: not run)")
    ap.add_argument("--kinds-rounds", type=int, default=3)
    ap.add_argument("--baseline-dir", type=Path,
                    help="older code, measured phase by phase (and kind by kind) beside this one")
    ap.add_argument("--port", type=int, default=18432)
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_TEST_DATABASE_URL",
                                                       "postgresql://postgres@127.0.0.1/postgres"))
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    devices = fabric()
    url = create_db(args.server, "fw_load")
    results: dict[tuple[str, float, str], tuple[dict[str, list[float]], Phase]] = {}
    kinds: list[tuple[str, str, Phase, dict[str, list[float]]]] = []
    warmups: dict[tuple[str, float, str], dict[str, list[float]]] = {}
    try:
        add_inventory(url, devices)
        seed(url)
        # The generator's own full collections (measured 2026-12-04: 107-140 CPU ms each, about one a phase, over
        # the ~166k objects of the modules the seed imported) stopped its sends and reads for that long: latency
        # charged to the server. What lives now lives to the end: out of the collector's sight.
        gc.collect()
        gc.freeze()
        base = f"http://127.0.0.1:{args.port}"
        with api_server(url, args.port, args.workers, args.app_dir) as server, contextlib.ExitStack() as more:
            servers = [(str(args.app_dir), server, base)]
            if args.baseline_dir:
                b = f"http://127.0.0.1:{args.port + 1}"
                servers.append((str(args.baseline_dir),
                                more.enter_context(api_server(url, args.port + 1, args.workers, args.baseline_dir)), b))
            pushers = devices[:args.ingest_devices]
            ingest = PushStats()
            first = True
            for r in rates:
                # With a baseline, each rate's phases run on one server and then the other, the ingest stream
                # pushing to the server being measured (its CPU is in that server's figures, as without one).
                for app_dir, srv, srv_base in servers:
                    t = Ingest(srv_base, pushers, ingest)
                    t.start()
                    # The stream's first interval creates its series; measure in steady state.
                    time.sleep(12 if first else 3)
                    first = False
                    for what in ("anchor", "mix"):
                        if args.warmup:  # the same requests first, reported apart: the caches fill
                            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as run:
                                warmups[(app_dir, r, what)] = run.run(open_loop(
                                    srv_base, r, args.warmup, anchor=what == "anchor", revalidate=args.revalidate,
                                    client=args.client))
                        gen_cpu: list[float] = []
                        writer = AlertWriter(url, args.alert_writes if what == "mix" else 0.0)
                        with Phase(srv, url) as phase, writer, \
                                asyncio.Runner(loop_factory=uvloop.new_event_loop) as run:
                            res = run.run(open_loop(srv_base, r, args.seconds, anchor=what == "anchor",
                                                    revalidate=args.revalidate, client=args.client, cpu=gen_cpu))
                        phase.generator_s = gen_cpu[0]
                        results[(app_dir, r, what)] = (res, phase)
                        time.sleep(2)  # let a backlog drain before the next phase
                    t.stop()
            if args.kinds:
                time.sleep(5)  # what the server still had of the stream finishes before the first idle phase
                # Without the ingest stream: its CPU is most of what an idle phase measures, and its share of a
                # phase would be noise on the difference (the series read what it stored until now).
                kind_phases(args, url, servers, kinds)
        n_ports = sum(p for _, _, p in pushers)
        print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}; "
              f"{args.workers} uvicorn workers serving {args.app_dir}"
              f"{f' and {args.baseline_dir}, phase by phase' if args.baseline_dir else ''}, load generator on the "
              f"same machine; load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"ingest stream  : {len(pushers)} devices, {n_ports * 40 / 10:,.0f} samples/s offered, "
              f"{ingest.written:,} written, {ingest.errors} errors, push p50 {pct(ingest.latencies, 0.5):.0f} ms")
        for (app_dir, r, what), (res, phase) in results.items():
            if args.baseline_dir:
                print(f"{app_dir}:")
            names = ("healthz",) if what == "anchor" else ("alerts", "series")
            for name in names:
                if (app_dir, r, what) in warmups:
                    xs = warmups[(app_dir, r, what)][name]
                    print(f"{r:5.0f} req/s  {name:7s}: warm-up {args.warmup:.0f} s, not counted below: n={len(xs):5d}  "
                          f"p50 {pct(xs, 0.5):7.1f} ms  p99 {pct(xs, 0.99):7.1f} ms  max {pct(xs, 1.0):7.1f} ms")
                xs = res[name]
                print(f"{r:5.0f} req/s  {name:7s}: n={len(xs):5d}  p50 {pct(xs, 0.5):7.1f} ms  "
                      f"p99 {pct(xs, 0.99):7.1f} ms  max {pct(xs, 1.0):7.1f} ms")
            n = sum(len(res[x]) for x in names)
            print(f"{r:5.0f} req/s  {what}: errors/timeouts {len(res['errors'])}, 304s {len(res['not_modified'])}; "
                  f"API + its database {1000 * phase.api_cores * phase.wall / n:.2f} CPU ms/request "
                  f"(ingest included), {phase.api_cores:.2f} cores over {phase.wall:.0f} s; machine busy "
                  f"{phase.machine_cores:.2f} of {os.cpu_count()} cores; generator ({args.client}) "
                  f"{1000 * phase.generator_s / n:.2f} CPU ms/request, {phase.generator_s / phase.wall:.2f} cores, "
                  f"{len(phase.gc_pauses)} collections {1000 * sum(phase.gc_pauses):.0f} ms in all, the longest "
                  f"{1000 * max(phase.gc_pauses, default=0):.1f} ms")
        report_kinds(args, kinds)
        if TRACE is not None:
            Path(os.environ["FWTRACE_DIR"], "client.json").write_text(json.dumps(TRACE))
    finally:
        drop_db(args.server, url)


class Ingest(threading.Thread):
    """The ingest stream (bench/ingest_soak.py's push loop) in a thread of its own, until stopped."""

    def __init__(self, base: str, devices: list[tuple[str, str, int]], stats: PushStats) -> None:
        super().__init__(daemon=True)
        self.base, self.devices, self.stats = base, devices, stats
        self.ready = threading.Event()

    def run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.task = asyncio.ensure_future(push_loop(self.base, self.devices, float("inf"), self.stats, 8))
            self.ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

        asyncio.run(main())

    def stop(self) -> None:
        """Cancel the loop and every push still in flight (a cancelled push is not counted as an error)."""
        def cancel_all() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()

        self.ready.wait()
        self.loop.call_soon_threadsafe(cancel_all)
        self.join()


async def closed_loop(base: str, n: int, kind: int, in_flight: int = 2) -> dict[str, list[float]]:
    """n requests of one kind, `in_flight` at a time; latency from each request's own start."""
    out: dict[str, list[float]] = {"alerts": [], "series": [], "errors": []}
    rng = random.Random(kind)
    todo = iter(range(n))
    async with aiohttp.ClientSession(base, timeout=aiohttp.ClientTimeout(total=30)) as client:
        async def worker() -> None:
            for i in todo:
                name, path, params = request_for(i, rng, kind)
                t0 = time.perf_counter()
                try:
                    async with client.get(path, params=params) as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                out[name].append(time.perf_counter() - t0)
                if not ok:
                    out["errors"].append(1.0)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return out


def kind_phases(args: argparse.Namespace, url: str, servers: list[tuple[str, Any, str]],
                out: list[tuple[str, str, Phase, dict[str, list[float]]]]) -> None:
    """Idle (ingest only), then rounds of each kind alone, then idle again; servers alternate phase by phase."""
    def idle() -> None:
        for app_dir, server, _ in servers:
            with Phase(server, url) as phase:
                time.sleep(10)
            out.append((app_dir, "idle", phase, {}))

    idle()
    for _ in range(args.kinds_rounds):
        for i, name in enumerate(KINDS):
            for app_dir, server, base in servers:
                asyncio.run(closed_loop(base, 20, i))  # warm: each process fills its pool
                with Phase(server, url) as phase:
                    res = asyncio.run(closed_loop(base, args.kinds, i))
                out.append((app_dir, name, phase, res))
    idle()


def report_kinds(args: argparse.Namespace, kinds: list[tuple[str, str, Phase, dict[str, list[float]]]]) -> None:
    if not kinds:
        return
    print(f"each kind alone, {args.kinds} requests x {args.kinds_rounds} rounds, 2 in flight; CPU of API + its "
          "database per request, ingest stopped, less the idle phases of the same code: median of the rounds "
          "[each round]")
    for app_dir in dict.fromkeys(a for a, *_ in kinds):
        mine = [k for k in kinds if k[0] == app_dir]
        idle = [ph.api_cores for _, name, ph, _ in mine if name == "idle"]
        idle_cores = sum(idle) / len(idle)
        print(f"  {app_dir}: idle {idle_cores:.3f} cores ({', '.join(f'{c:.3f}' for c in idle)})")
        for name in KINDS:
            per, lat, busy, errors = [], [], [], 0
            for _, k, ph, res in mine:
                if k != name:
                    continue
                xs = res["alerts"] + res["series"]
                per.append(1000 * (ph.api_cores - idle_cores) * ph.wall / max(1, len(xs)))
                lat += xs
                busy.append(ph.machine_cores)
                errors += len(res["errors"])
            per_s = sorted(per)
            rounds = ", ".join(f"{p:.2f}" for p in per)
            print(f"    {name:20s}: {per_s[len(per_s) // 2]:6.2f} CPU ms/request [{rounds}]; "
                  f"latency p50 {pct(lat, 0.5):5.1f} ms, errors {errors}; machine busy "
                  f"{min(busy):.2f}-{max(busy):.2f} cores")


if __name__ == "__main__":
    main()
