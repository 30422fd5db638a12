"""Memory of one `fabricwatch worker` by pool: threads against prefork, same concurrency, after real work.

    python bench/worker_memory.py --server postgresql://postgres@127.0.0.1:5432/postgres \
        --redis redis://127.0.0.1:6379/13 [--concurrency 8] [--seconds 90]

For each pool, a fresh database (migrated, dropped afterwards) with 8 SNMP switches (snmpsim serving the
real Arista walk of tests/data/snmp) and 16 GPU hosts (the sysfs tree of tests/data/host), every group
polled every 2 s, detection every 10 s. A separate `fabricwatch beat` schedules; only the worker is
measured: the samples it stores per second over the second half of `--seconds` (the first warms up), and
after them the sum over its processes (main process and pool) of RSS, USS (memory
only that process holds) and PSS (shared pages split between the processes that share them) from psutil.
USS + the parent's shared pages is what the worker costs the machine; PSS adds up to that. Not a test.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest_soak import create_db, drop_db  # noqa: E402  (bench scripts share helpers; not a package)

from tests.faults.peers import ARISTA, COMMUNITY_ENV, load_inventory, snmp_device  # noqa: E402
from tests.snmp_peers import start_snmpsim  # noqa: E402

SYSFS = REPO / "tests/data/host/sysfs_roce"
QUEUE = "fabricwatch"


def inventory(snmp_port: int) -> list[dict[str, object]]:
    fast = {"counters": 2, "optics": 2, "state": 2}
    switches = [snmp_device(f"mem-leaf-{i}", snmp_port, QUEUE, counters_s=2, others_s=2) for i in range(8)]
    hosts = [{"name": f"mem-gpu-{i:02d}", "kind": "host", "role": "host", "gpus": 8,
              "ports": [{"name": "ens1f0np0", "nic": "mlx5_0", "rail": 0, "gpu": 0}],
              "endpoints": [{"protocol": "host", "sysfs_root": str(SYSFS), "queue": QUEUE, "intervals": fast,
                             "timeout_s": 2}]} for i in range(16)]
    return [*switches, *hosts]


def tree_memory(pid: int) -> dict[str, float]:
    """MiB summed over the process and its descendants; and how many processes."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    infos = [p.memory_full_info() for p in procs]
    mib = 1 << 20
    return {"processes": len(procs), "rss": sum(i.rss for i in infos) / mib, "uss": sum(i.uss for i in infos) / mib,
            "pss": sum(i.pss for i in infos) / mib}


def samples_stored(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as c:
        return int(c.execute("SELECT count(*) FROM samples").fetchone()[0])


def measure(pool: str, args: argparse.Namespace, snmp_port: int) -> dict[str, float]:
    url = create_db(args.server, "fw_bench_mem")
    work = Path(tempfile.mkdtemp(prefix="fw-bench-mem-"))
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": url, "FABRICWATCH_REDIS_URL": args.redis,
           "FABRICWATCH_LOG_LEVEL": "WARNING", "FABRICWATCH_DETECT_INTERVAL_S": "10", COMMUNITY_ENV: "arista",
           "FABRICWATCH_SPOOL_DIR": str(work / "spool")}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        load_inventory(url, inventory(snmp_port))
        with (work / "worker.log").open("wb") as log:
            worker = subprocess.Popen([sys.executable, "-m", "service.cli", "worker", "--pool", pool, "-c",
                                       str(args.concurrency)], env=env, cwd=REPO, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(worker)
            procs.append(subprocess.Popen([sys.executable, "-m", "service.cli", "beat"], env=env, cwd=REPO,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(args.seconds / 2)
        half = samples_stored(url)
        time.sleep(args.seconds / 2)
        assert worker.poll() is None, (work / "worker.log").read_text()[-3000:]
        rate = (samples_stored(url) - half) / (args.seconds / 2)
        return {**tree_memory(worker.pid), "rate": rate}
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        drop_db(args.server, url)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="PostgreSQL URL of a maintenance database (postgres)")
    ap.add_argument("--redis", required=True, help="Redis URL for the broker (a database no one else uses)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--pools", default="threads,prefork")
    args = ap.parse_args()
    peer = start_snmpsim({"arista": ARISTA})
    try:
        print(f"fabricwatch worker -c {args.concurrency}, {args.seconds:g} s of work; MiB summed over its processes")
        print(f"{'pool':8} {'procs':>5} {'RSS':>8} {'USS':>8} {'PSS':>8} {'samples/s':>10} (second half)")
        for pool in args.pools.split(","):
            m = measure(pool, args, peer.port)
            print(f"{pool:8} {m['processes']:>5} {m['rss']:>8.0f} {m['uss']:>8.0f} {m['pss']:>8.0f} "
                  f"{m['rate']:>10.0f}", flush=True)
    finally:
        peer.close()


if __name__ == "__main__":
    main()
