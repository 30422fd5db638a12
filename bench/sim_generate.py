"""Simulator benchmark: topology build at 100k GPUs; generation rate and peak memory for 512 hosts.

Usage: python bench/sim_generate.py [--hours H] [--out DIR]
The 30-day run is projected from a shorter measured range (generation cost is linear in steps).
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    tmp = a.out or Path(tempfile.mkdtemp(prefix="simbench-"))
    try:
        bench_topology(tmp)
        bench_generate(tmp, a.hours)
    finally:
        if a.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
