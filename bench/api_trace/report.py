"""Summarise a bench/api_trace run: per API worker, where its reads' time went and what stopped its event loop.

    python bench/api_trace/report.py /tmp/trace [--seconds 20]

For each worker (a trace file with reads), over the last `--seconds` of its reads (the last mix phase):
- the reads' time in the server by phase (arrival -> thread-pool submit -> start -> end -> back on the
  loop -> return), p50 / p99 / max, per path;
- its garbage collections: count, longest and total CPU per generation;
- its event-loop stalls over 4, 20 and 50 ms: how long in all, and of that how much CPU the process used
  (its loop thread and its other threads: work of its own, or the GIL held) and how long it was not running
  at all (other processes had the cores);
- its imports: CPU of the pool thread per push.
And the bench's own process (no reads): its collections during the phases in client.json.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

READS = ("/api/v1/alerts", "/api/v1/series")
Record = dict[str, Any]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000 if s else float("nan")


def spread(xs: list[float]) -> str:
    return f"p50 {pct(xs, 0.5):7.2f}  p99 {pct(xs, 0.99):7.2f}  max {pct(xs, 1.0):7.2f} ms"


PHASES: tuple[tuple[str, Callable[[Record], float]], ...] = (
    ("arrival -> submit", lambda r: r["pool"][0]["sub"] - r["in"]),
    ("wait for a thread", lambda r: sum(c["s"] - c["sub"] for c in r["pool"])),
    ("in the thread", lambda r: sum(c["e"] - c["s"] for c in r["pool"])),
    ("  its CPU", lambda r: sum(c["cpu"] for c in r["pool"])),
    ("back on the loop", lambda r: sum(c["back"] - c["e"] for c in r["pool"])),
    ("then to return", lambda r: r["out"] - r["pool"][-1]["back"]),
)


def collections_line(gcs: list[Record]) -> str:
    """Count, longest and total CPU of the collections, per generation."""
    by: dict[int, list[float]] = defaultdict(list)
    for g in gcs:
        by[g["gen"]].append(g["cpu"])
    return "; ".join(
        f"gen{gen} {len(xs)}, longest {max(xs) * 1000:.1f} ms, {sum(xs) * 1000:.0f} ms in all"
        for gen, xs in sorted(by.items())
    )


def worker(name: str, recs: list[Record], seconds: float) -> None:
    """One API worker's reads, collections and loop stalls over the last `seconds` of its reads."""
    reads = [r for r in recs if r["k"] == "req" and r["p"] in READS]
    hi = max(r["in"] for r in reads)
    lo = hi - seconds
    reads = [r for r in reads if r["in"] >= lo]
    print(f"{name} (port {reads[0]['port']}): {len(reads)} reads in the last {seconds:.0f} s")
    for path in READS:
        mine = [r for r in reads if r["p"] == path]
        if not mine:
            continue
        print(f"  {path}: {len(mine)}, in the server {spread([r['out'] - r['in'] for r in mine])}")
        pooled = [r for r in mine if r.get("pool") and all("e" in c for c in r["pool"])]
        if pooled:
            print(f"    through the thread pool: {len(pooled)}")
            for label, f in PHASES:
                print(f"      {label:18s} {spread([f(r) for r in pooled])}")
    imports = [
        c
        for r in recs
        if r["k"] == "req" and r["p"].startswith("/api/v1/import") and lo <= r["in"] <= hi
        for c in r.get("pool", [])
        if "e" in c
    ]
    if imports:
        cpu = [c["cpu"] for c in imports]
        print(f"  imports: {len(imports)}, CPU in the thread {spread(cpu)}, {sum(cpu):.2f} s in all")
    print(f"  collections (CPU): {collections_line([g for g in recs if g['k'] == 'gc' and lo <= g['t'] <= hi])}")
    lags = [x for x in recs if x["k"] == "lag" and lo <= x["t"] <= hi]
    for floor in (0.004, 0.02, 0.05):
        over = [x for x in lags if x["d"] > floor]
        wall = sum(x["d"] + 0.002 for x in over)
        cpu, loop = sum(x["proc"] for x in over), sum(x["loop"] for x in over)
        print(
            f"  loop stalls over {floor * 1000:2.0f} ms: {len(over):4d}, {wall:6.2f} s; the process ran {cpu:5.2f} s "
            f"(loop thread {loop:5.2f}, others {cpu - loop:5.2f}), not running {max(0.0, wall - cpu):5.2f} s"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--seconds", type=float, default=20.0, help="the last this many seconds of each worker's reads")
    args = ap.parse_args()
    client = json.loads((args.dir / "client.json").read_text()) if (args.dir / "client.json").exists() else []
    for path in sorted(args.dir.glob("trace-*.jsonl")):
        recs = [json.loads(line) for line in path.open()]
        if any(r["k"] == "req" and r["p"] in READS for r in recs):
            worker(path.name, recs, args.seconds)
        elif client and (gcs := [g for g in recs if g["k"] == "gc"]):
            # the bench's process (the uvicorn supervisor collects too, but not while the phases run)
            for what in ("anchor", "mix"):
                mine = [c for c in client if (c[0] == "healthz") == (what == "anchor")]
                lo, hi = min(c[1] for c in mine), max(c[1] + c[2] for c in mine)
                if inside := [g for g in gcs if lo <= g["t"] <= hi]:
                    print(f"{path.name} (the bench's process), {what} phases: {collections_line(inside)}")


if __name__ == "__main__":
    main()
