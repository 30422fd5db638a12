"""Replay benchmark (#22 item 2): a backtest over bulk-imported history, streamed against per-window reads.

    python bench/replay.py prepare [--days 7] [--one-import]   # simulate + import into a kept database
    python bench/replay.py run [--days 7] [--anchor-hours 2] [--compress] [--read-only] [--no-alerts]
    python bench/replay.py prepare|run --dense --days 1 ...    # every metric every 60 s: 5-15x the samples a cycle

The history: a 24-switch, 320-port rail-optimized fabric (20 hosts x 4 NICs, 4 spines), the simulator's
physical metric mix with counters polled every 5 minutes and optics every 15 (bench/detection_eval.py's
sparsest cadence cell), imported one simulated day per `import_prometheus` call: the first import creates the
series and stores their day as per-series blocks, later days of existing series land as rows. With
`--one-import` the whole history is one import, all of it per-series day blocks. It is kept in the database
`fw_replay_bench` between runs.

`run` measures, in one process and one run:
0. the read alone: the replay's reader over the whole history, no engine (wall, and CPU here and in the
   PostgreSQL backend, read from /proc: the bench and the server on one machine);
1. streamed: `backtest` over the whole history at a 60 s step (service/detection/replay.py reads each stored
   sample once, a day at a time); samples of stored history per second, wall and CPU time;
2. anchor: the per-window path (one `read_samples` query per cycle, as before), over the first
   `--anchor-hours` of the same history (it is too slow for the whole week), as seconds per cycle and that
   rate extrapolated to the week;
and checks that the streamed and per-window cycles gave the same findings on the anchor's range.

    python bench/replay.py side --baseline TREE [--tree TREE] [--days 7] [--findings-dir DIR]

`side` runs the streamed backtest of two source trees at once, in two processes over the same kept
database (say a `git worktree` of the commit before a change, and this checkout): each one's wall and CPU
seconds, stored samples per second and per CPU second, findings and their sha256; then the two findings
files compared byte for byte (exit 1 if they differ). CPU seconds are the figure to compare on a shared
machine; the load average is printed at the start and at each end.
With `--compress` the blocks are first moved into compressed chunks (`run_compression` run to the end; this
changes the kept database: `prepare` again for blocks), and the same is measured over chunks.
Not a test: the figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import resource
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DB = "fw_replay_bench"
T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z
SPEC: dict[str, Any] = {
    "name": "replay-bench", "seed": 7,
    "topology": {"shape": "rail-optimized", "hosts": 20, "nics_per_host": 4, "gpus_per_host": 4,
                 "hosts_per_leaf": 4, "spines": 4, "optics_mix": {"400G-DR4": 0.8, "400G-DAC": 0.2}},
    "faults": [{"type": "dirty_connector", "device": "host-p1-00003", "port": "eth1", "lanes": [1], "drop_db": 4,
                "at": "2d"},
               {"type": "post_fec", "device": "host-p1-00007", "port": "eth2", "at": "4d"}]}
COUNTERS_S, OPTICS_S = 300, 900
OPTIC_METRICS = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
                 "optic_voltage_volts"}


def _url(server: str, name: str) -> str:
    return server.rsplit("/", 1)[0] + "/" + name


def prepare(server: str, days: int, one_import: bool) -> None:
    import psycopg
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from service.db import get_engine
    from service.inventory.schemas import Inventory
    from service.inventory.service import upsert_inventory
    from service.migrate import upgrade
    from service.telemetry.service import import_prometheus
    from simulator.generate import BlockText, write_frame
    from simulator.scenarios import Scenario
    from simulator.telemetry import make_sim, resolve_inventory, timeline

    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB}"')
    url = _url(server, DB)
    upgrade(url)
    engine = get_engine(url)
    sc = Scenario.model_validate(SPEC)
    inv = resolve_inventory(sc.inventory_source())
    with Session(engine) as s:
        upsert_inventory(session=s, inventory=Inventory.model_validate(inv))
        s.commit()
    sim = make_sim(inv, sc, T0)
    texts = {b.metric: BlockText(b, sim.m) for b in sim.blocks}
    clock, n = time.perf_counter(), 0

    def day_text(day: int) -> bytes:
        nonlocal n
        buf = io.StringIO()
        for t in timeline(T0 + day * 86400, T0 + (day + 1) * 86400 - COUNTERS_S, COUNTERS_S):
            frame = sim.step(t, COUNTERS_S)
            if round(t - T0) % OPTICS_S:
                for name in [m for m in frame.values if m in OPTIC_METRICS]:
                    del frame.values[name]
                    frame.keep.pop(name, None)
            n += write_frame(sim, texts, frame, buf)
        print(f"day {day + 1}/{days}: {n:,} samples, {time.perf_counter() - clock:.0f} s", flush=True)
        return buf.getvalue().encode()

    if one_import:  # every series created by this import: all of it lands as per-series day blocks
        import_prometheus(engine=engine, chunks=(day_text(d) for d in range(days)), source="history")
    else:  # the first day creates the series (blocks); later imports of existing series land as rows
        for day in range(days):
            import_prometheus(engine=engine, chunks=[day_text(day)], source=f"day{day}")
    with engine.begin() as c:
        c.execute(text("ANALYZE"))
    with engine.connect() as c:
        blocks = c.execute(text("SELECT count(*) FROM sample_blocks")).scalar_one()
    print(f"prepared {DB}: {sim.m.P} ports, {n:,} samples over {days} days; {blocks:,} blocks")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn: Any) -> tuple[Any, float, float]:
    """(result, wall s, CPU s of this process)"""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


class _Backend:
    """CPU seconds a PostgreSQL backend on this machine has used since this was made (NaN elsewhere)."""

    def __init__(self, pid: int) -> None:
        self.path, self.tick = Path(f"/proc/{pid}/stat"), os.sysconf("SC_CLK_TCK")
        self.start = self._now()

    def _now(self) -> float:
        try:
            f = self.path.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(f[11]) + int(f[12])) / self.tick  # utime + stime

    def cpu_s(self) -> float:
        return self._now() - self.start


def compress_all(engine: Any, days: int) -> None:
    """Move every row and block of the history into chunks (the beat task's work, run to the end)."""
    from service.telemetry.compress import run_compression

    now = datetime.fromtimestamp(T0 + days * 86400, UTC) + timedelta(hours=2)
    clock = time.perf_counter()
    while True:
        run = run_compression(engine, now=now, hot_s=3600, max_batches=10**6)
        if run.complete:
            break
    print(f"compressed into chunks in {time.perf_counter() - clock:.0f} s")


def run(server: str, days: int, anchor_hours: float, compress: bool, alerts: bool, read_only_pass: bool,
        findings_out: str | None = None) -> None:
    import hashlib
    import json

    from sqlalchemy import text

    from service.db import get_engine
    from service.detection.replay import HistoryReader
    from service.detection.service import backtest, load_fabric, load_series
    from service.detection.state import Config

    engine = get_engine(_url(server, DB))
    if compress:
        compress_all(engine, days)
    with engine.connect() as c:
        chunks = c.execute(text("SELECT count(*) FROM sample_chunks")).scalar_one()
        blocks = c.execute(text("SELECT count(*) FROM sample_blocks")).scalar_one()
        ports = c.execute(text("SELECT count(*) FROM ports")).scalar_one()
        rows = c.execute(text("SELECT count(*) FROM sample_rows")).scalar_one()
    cfg, step = Config(), 60_000
    a = int(T0 * 1000) + cfg.initial_lookback_ms + cfg.lateness_ms  # the first read starts at T0
    b = int(T0 * 1000) + days * 86_400_000
    cycles = (b - a) // step + 1
    print(f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start; {ports} ports; {rows:,} rows, {blocks:,} blocks, "
          f"{chunks:,} chunks; {days} days at {step // 1000} s: {cycles:,} cycles")

    # the read alone: the stored samples the replay covers, a day at a time
    server_cpu: list[float] = []

    def read_only() -> int:
        with engine.connect() as conn:
            backend = _Backend(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            fabric = load_fabric(conn)
            sx = load_series(conn, fabric)
            reader = HistoryReader(conn, fabric, until_ms=b - cfg.lateness_ms)
            lo = a - cfg.lateness_ms - cfg.initial_lookback_ms
            for t in range(a, b + 1, step):
                _, sx = reader.read(lo, t - cfg.lateness_ms, sx)
                lo = t - cfg.lateness_ms
            server_cpu.append(backend.cpu_s())
            return reader.samples_read

    n, wall, cpu = _timed(read_only)
    both = cpu + server_cpu[0] if server_cpu[0] == server_cpu[0] else float("nan")
    print(f"read only: {n:,} stored samples in {wall:.1f} s ({n / wall / 1e6:.2f} M samples/s); CPU {cpu:.1f} s here "
          f"+ {server_cpu[0]:.1f} s in the PostgreSQL backend = {n / both / 1e6:.2f} M samples per CPU second")

    if read_only_pass:
        return
    clock = time.perf_counter()

    def progress(at_ms: int, _: list) -> None:
        if (at_ms - a) % 86_400_000 < step:
            print(f"  streamed: day {(at_ms - a) // 86_400_000 + 1} begins at {time.perf_counter() - clock:.0f} s",
                  flush=True)

    found, s_wall, s_cpu = _timed(lambda: backtest(engine, a, b, step, config=cfg, on_cycle=progress))
    print(f"streamed backtest: {cycles:,} cycles in {s_wall:.1f} s (CPU {s_cpu:.1f} s), {n / s_wall / 1e6:.2f} M "
          f"samples/s ({n / s_cpu / 1e6:.2f} M per CPU second), {s_wall / cycles * 1000:.1f} ms/cycle "
          f"({s_cpu / cycles * 1000:.1f} ms CPU), {len(found):,} findings; peak RSS {_rss_mib():.0f} MiB; load average "
          f"{os.getloadavg()[0]:.1f} at its end")
    lines = [json.dumps(f.to_dict(), sort_keys=True, default=str) for f in found]
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    print(f"findings sha256 {digest} (to compare runs of different code over the same history)")
    if findings_out:
        Path(findings_out).write_text("\n".join(lines) + "\n")

    if alerts:
        from service.pipeline import replay_alerts

        outs, c_wall, _ = _timed(lambda: replay_alerts(engine, a, b, step, config=cfg))
        changes = sum(len(o.changes.changes) for o in outs)
        print(f"replay_alerts (fabricwatch backtest's path, alert tables shadowed): {c_wall:.1f} s, "
              f"{n / c_wall / 1e6:.2f} M samples/s, {changes} alert changes")

    # the anchor: the per-window path, a query per cycle, over the first hours; the same range streamed
    b2 = a + int(anchor_hours * 3_600_000)
    k = (b2 - a) // step + 1
    old, o_wall, o_cpu = _timed(lambda: backtest(engine, a, b2, step, config=cfg, span_ms=None))
    new, n_wall, _ = _timed(lambda: backtest(engine, a, b2, step, config=cfg))
    same = [f.to_dict() for f in old] == [f.to_dict() for f in new]
    per = o_wall / k
    print(f"anchor, per-window reads: {k} cycles ({anchor_hours:g} h) in {o_wall:.1f} s (CPU {o_cpu:.1f} s): "
          f"{per * 1000:.0f} ms/cycle, {per * cycles / 3600:.2f} h extrapolated to the {days} days; streamed over "
          f"the same range {n_wall:.1f} s; findings identical: {same}")
    print(f"ratio (per-window extrapolated / streamed, whole range): {per * cycles / s_wall:.0f}x")
    if not same:
        sys.exit(1)


def _range_ms(days: int) -> tuple[int, int, int]:
    """(first cycle, last cycle, step) of the week's backtest, as `run` has them."""
    from service.detection.state import Config

    cfg = Config()
    return int(T0 * 1000) + cfg.initial_lookback_ms + cfg.lateness_ms, int(T0 * 1000) + days * 86_400_000, 60_000


def child(server: str, days: int, findings_out: str) -> None:
    """One side of `side`: the backtest of the tree on sys.path[0]; one JSON line on stdout."""
    import hashlib
    import json
    import subprocess

    from service.db import get_engine
    from service.detection.service import backtest

    a, b, step = _range_ms(days)
    load = os.getloadavg()[0]
    found, wall, cpu = _timed(lambda: backtest(get_engine(_url(server, DB)), a, b, step))
    lines = [json.dumps(f.to_dict(), sort_keys=True, default=str) for f in found]
    Path(findings_out).write_text("\n".join(lines) + "\n")
    tree = sys.path[0]
    head = subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h"], capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "-C", tree, "status", "--short", "--untracked-files=no"], capture_output=True,
                           text=True).stdout
    print(json.dumps({"tree": tree, "commit": head.strip() + ("+changes" if dirty.strip() else ""), "wall": wall,
                      "cpu": cpu, "cycles": (b - a) // step + 1, "findings": len(found),
                      "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16], "rss_mib": _rss_mib(),
                      "load_start": load, "load_end": os.getloadavg()[0]}))


def stored_samples(server: str, days: int) -> int:
    """Stored samples the backtest reads, (T0 - ..., last read]: rows, import blocks' elements, chunks."""
    from sqlalchemy import text

    from service.db import get_engine
    from service.detection.state import Config

    cfg = Config()
    a, b, _ = _range_ms(days)
    lo = datetime.fromtimestamp((a - cfg.lateness_ms - cfg.initial_lookback_ms) / 1000, UTC)
    hi = datetime.fromtimestamp((b - cfg.lateness_ms) / 1000, UTC)
    p = {"lo": lo, "hi": hi}
    with get_engine(_url(server, DB)).connect() as c:
        rows = c.execute(text("SELECT count(*) FROM sample_rows WHERE ts > :lo AND ts <= :hi"), p).scalar_one()
        blocks = c.execute(text(
            "SELECT coalesce(sum((SELECT count(*) FROM unnest(ts) u WHERE u > :lo AND u <= :hi)), 0) "
            "FROM sample_blocks WHERE last_ts > :lo AND first_ts <= :hi"), p).scalar_one()
        chunks = c.execute(text(
            "SELECT coalesce(sum(n), 0) FROM sample_chunks WHERE first_ts > :lo AND last_ts <= :hi"), p).scalar_one()
        partial = c.execute(text("SELECT count(*) FROM sample_chunks WHERE last_ts > :lo AND first_ts <= :hi AND "
                                 "NOT (first_ts > :lo AND last_ts <= :hi)"), p).scalar_one()
    if partial:
        raise SystemExit(f"{partial} chunks cross the backtest's range: count with `run` (its read pass)")
    return int(rows) + int(blocks) + int(chunks)


def side(server: str, days: int, baseline: str, tree: str, out_dir: str) -> None:
    """Two trees' backtests at once, each in its own process; findings compared byte for byte."""
    import json
    import subprocess

    n = stored_samples(server, days)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"{n:,} stored samples over {days} days")
    procs = {}
    for name, t in (("before", baseline), ("after", tree)):
        cmd = [sys.executable, str(Path(__file__).resolve()), "child", "--tree", str(Path(t).resolve()),
               "--days", str(days), "--server", server, "--findings", str(Path(out_dir) / f"{name}.jsonl")]
        procs[name] = subprocess.Popen(cmd, cwd=t, stdout=subprocess.PIPE, text=True)
    got = {}
    for name, p in procs.items():
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"{name} failed ({p.returncode})")
        got[name] = json.loads(out.strip().splitlines()[-1])
    print("| | " + " | ".join(f"{k} ({v['commit']})" for k, v in got.items()) + " |")
    print("|---|---|---|")
    rows = [("wall", lambda r: f"{r['wall']:.1f} s, {r['wall'] / r['cycles'] * 1000:.1f} ms/cycle"),
            ("CPU (process)", lambda r: f"{r['cpu']:.1f} s, {r['cpu'] / r['cycles'] * 1000:.1f} ms/cycle"),
            ("stored samples per second, wall", lambda r: f"{n / r['wall'] / 1e3:.0f} k"),
            ("stored samples per CPU second", lambda r: f"{n / r['cpu'] / 1e6:.3f} M"),
            ("load average at start / end", lambda r: f"{r['load_start']:.1f} / {r['load_end']:.1f}"),
            ("findings", lambda r: f"{r['findings']:,}, sha256 {r['sha256']}"),
            ("peak RSS", lambda r: f"{r['rss_mib']:.0f} MiB")]
    for label, fmt in rows:
        print(f"| {label} | " + " | ".join(fmt(r) for r in got.values()) + " |")
    same = (Path(out_dir) / "before.jsonl").read_bytes() == (Path(out_dir) / "after.jsonl").read_bytes()
    cpu = got["after"]["cpu"] / got["before"]["cpu"]
    print(f"findings byte-identical: {same}; CPU after/before {cpu:.3f} ({(cpu - 1) * 100:+.1f} %)")
    if not same:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("prepare", "run", "side", "child"))
    ap.add_argument("--server", default=os.environ.get("FABRICWATCH_BENCH_SERVER",
                                                       "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--anchor-hours", type=float, default=2.0)
    ap.add_argument("--compress", action="store_true",
                    help="first move the kept history into compressed chunks (run `prepare` again for blocks)")
    ap.add_argument("--one-import", action="store_true",
                    help="prepare: the whole history in one import (all blocks) instead of one import per day")
    ap.add_argument("--read-only", action="store_true", help="only the read pass (no backtest, no anchor)")
    ap.add_argument("--findings", metavar="PATH", help="write the streamed backtest's findings here (JSON lines)")
    ap.add_argument("--no-alerts", dest="alerts", action="store_false",
                    help="skip the replay_alerts (CLI path) measurement")
    ap.add_argument("--baseline", metavar="TREE", help="side: the source tree to compare against")
    ap.add_argument("--tree", metavar="TREE", default=str(REPO), help="side: the tree to measure (this one)")
    ap.add_argument("--findings-dir", default="/tmp/replay-side", help="side: where the two findings files go")
    ap.add_argument("--dense", action="store_true",
                    help="prepare/run: every metric polled every 60 s (the simulator's default cadence), kept as "
                         "fw_replay_dense")
    args = ap.parse_args()
    if args.dense:  # its own kept database: prepare and run it apart from the sparse week
        global DB, COUNTERS_S, OPTICS_S
        DB, COUNTERS_S, OPTICS_S = "fw_replay_dense", 60, 60
    if args.what == "child":  # the tree's own service package, not this checkout's
        sys.path.insert(0, args.tree)
        child(args.server, args.days, args.findings)
    elif args.what == "side":
        if not args.baseline:
            ap.error("side needs --baseline TREE")
        side(args.server, args.days, args.baseline, args.tree, args.findings_dir)
    elif args.what == "prepare":
        prepare(args.server, args.days, args.one_import)
    else:
        run(args.server, args.days, args.anchor_hours, args.compress, args.alerts, args.read_only, args.findings)


if __name__ == "__main__":
    main()
