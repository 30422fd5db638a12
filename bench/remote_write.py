"""Remote-write benchmark: the 4,096-GPU metric mix through POST /api/v1/write's code path vs the
Prometheus-text import path, in the same run, and VictoriaMetrics taking the same remote-write stream.

    python bench/remote_write.py [--intervals 4] [--server postgresql://postgres@127.0.0.1/postgres]

The fabric and its series are bench/ingest_soak.py's: 512 hosts x 8 ports, 64 leaves and 32 spines x 64
ports, 40 series a port (counters, state, optics per lane): 409,600 samples an interval.

1. text: each device's exposition through `import_prometheus` (parse, resolve, COPY, commit), as a
   POST /api/v1/import/prometheus per device does.
2. remote write: the same samples as Prometheus sends them (WriteRequests of 2,000 series with one
   sample each, snappy-compressed, built before the clock starts) through the receiver's code
   (`decompress`, `decode`, `write`: the exporter mapper, then the same Ingestor), one transaction each.
3. VictoriaMetrics (Debian victoria-metrics) receiving the same compressed bodies over HTTP.
4. remote write of what exporters would send for the same fabric, mapped: per host port node_exporter's
   netdev and InfiniBand counters (`node_network_*`, `node_infiniband_*`: 32-bit saturating widths),
   per host 8 GPUs of dcgm-exporter fields, per switch port snmp_exporter's if_mib objects (64-bit
   widths, ifOperStatus converted) and the DOM sensors of its optic; plus as many series that map to
   nothing (node_cpu_*, go_*): a Prometheus that forwards everything. Fewer catalogue samples than the
   mix, so its rate is compared per CPU-second, not per stream.

Each path has its own fresh database; the first interval (series creation) is reported apart from the
steady state (intervals 2..N). Rates are samples per CPU-second of the ingesting process (this
Python process for 1 and 2, measured with process_time, so PostgreSQL's own CPU is not in it; the
victoria-metrics process for 3), and per wall second. Not a test: figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cramjam
import httpx
import psutil
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import ingest_soak as soak  # noqa: E402  (the soak's fabric, inventory and exposition)

from service.db import get_engine  # noqa: E402
from service.telemetry import remote_write as rw  # noqa: E402
from service.telemetry.promtext import parse_lines  # noqa: E402
from service.telemetry.remote_write_pb2 import WriteRequest  # noqa: E402
from service.telemetry.service import import_prometheus  # noqa: E402

T0 = 1_796_040_000_000
STEP = 10_000
BATCH = 2000  # Prometheus' max_samples_per_send since 2.45
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}


def series_of(expo: soak.Exposition) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    out = []
    for pl in parse_lines(expo.text(T0).splitlines(), "bench"):
        labels = tuple(sorted([("__name__", pl.name), *pl.labels]))
        out.append((labels, pl.value))
    return out


def bodies(all_series: list[tuple[tuple[tuple[str, str], ...], float]], ts: int) -> list[bytes]:
    out = []
    for at in range(0, len(all_series), BATCH):
        req = WriteRequest()
        for labels, value in all_series[at:at + BATCH]:
            t = req.timeseries.add()
            for k, v in labels:
                t.labels.add(name=k, value=v)
            t.samples.add(timestamp=ts, value=value)
        out.append(bytes(cramjam.snappy.compress_raw(req.SerializeToString())))
    return out


def exporter_series(devices: list[tuple[str, str, int]]) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    """What node_exporter, dcgm-exporter and snmp_exporter would expose for the fabric (see the module doc)."""
    out: list[tuple[tuple[tuple[str, str], ...], float]] = []

    def add(name: str, value: float, **labels: str) -> None:
        out.append((tuple(sorted([("__name__", name), *labels.items()])), value))

    for d, (name, role, ports) in enumerate(devices):
        if role == "host":
            inst = f"{name}:9100"
            for p in range(ports):
                for m in ("receive_bytes_total", "transmit_bytes_total", "receive_packets_total",
                          "transmit_packets_total", "receive_errs_total", "transmit_errs_total",
                          "receive_drop_total", "transmit_drop_total", "carrier_changes_total"):
                    add(f"node_network_{m}", 1e9 + p, device=f"eth{p}", instance=inst, job="node")
                add("node_network_up", 1, device=f"eth{p}", instance=inst, job="node")
                for m in ("symbol_error_total", "link_downed_total", "link_error_recovery_total",
                          "port_transmit_wait_total", "port_errors_received_total"):
                    add(f"node_infiniband_{m}", 3, device=f"mlx5_{p}", port="1", instance=inst, job="node")
            for g in range(8):
                for f in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_LINK_GEN",
                          "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"):
                    add(f, 40, gpu=str(g), Hostname=name, instance=f"10.244.{d // 250}.{d % 250}:9400", job="dcgm")
            for i in range(60):  # what maps to nothing
                add("node_cpu_seconds_total", 1.0 * i, cpu=str(i // 8), mode=str(i % 8), instance=inst, job="node")
        else:
            for p in range(ports):
                port = soak.port_name(role, p)
                lab = {"ifName": port, "ifDescr": port, "ifIndex": str(p + 1), "instance": name, "job": "snmp"}
                for obj in ("ifHCInOctets", "ifHCOutOctets", "ifHCInUcastPkts", "ifHCOutUcastPkts", "ifInErrors",
                            "ifOutErrors", "ifInDiscards", "ifOutDiscards", "ifHighSpeed", "ifOperStatus"):
                    add(obj, 1.0, **lab)
                for k, (what, stype, scale, prec, v) in enumerate((
                        ("Temperature", 8, 9, 1, 410), ("Voltage", 4, 9, 2, 326), ("TX Bias", 5, 8, 2, 1656),
                        ("TX Power", 6, 8, 4, 2210), ("RX Power", 6, 8, 4, 2010))):
                    add("entPhySensorValue", v, entPhysicalDescr=f"DOM {what} Sensor for {port}",
                        entPhySensorType=str(stype), entPhySensorScale=str(scale), entPhySensorPrecision=str(prec),
                        entPhysicalIndex=str(100000000 + p * 100 + k), instance=name, job="snmp")
    return out


def exporter_inventory(url: str, devices: list[tuple[str, str, int]]) -> None:
    """The soak's inventory, with the RDMA device of each host port (mlx5_N: ethN), as exporters name them."""
    soak.add_inventory(url, devices)
    with psycopg.connect(url) as c:
        c.execute("UPDATE ports p SET nic = 'mlx5_' || substr(p.name, 4) FROM devices d "
                  "WHERE d.id = p.device_id AND d.kind = 'host'")


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--intervals", type=int, default=4)
    ap.add_argument("--server", default="postgresql://postgres@127.0.0.1/postgres")
    args = ap.parse_args()
    devices = soak.fabric()
    expos = [soak.Exposition(name, role, ports, seed=i) for i, (name, role, ports) in enumerate(devices)]
    per_interval = sum(len(e.template.splitlines()) for e in expos)
    print(f"# {platform.node()} {os.cpu_count()} cpu, {per_interval} samples/interval, {args.intervals} intervals")
    all_series = [s for e in expos for s in series_of(e)]
    results: dict[str, list[tuple[float, float, int]]] = {}

    # 1. text import
    url = soak.create_db(args.server, "fw_rwbench")
    try:
        soak.add_inventory(url, devices)
        engine = get_engine(url)
        results["text import"] = []
        for k in range(args.intervals):
            texts = [e.text(T0 + k * STEP).encode() for e in expos]
            cpu, wall = timed(lambda texts=texts: [import_prometheus(engine=engine, chunks=[t]) for t in texts])
            results["text import"].append((cpu, wall, per_interval))
        engine.dispose()
    finally:
        soak.drop_db(args.server, url)

    # 2. remote write, the receiver's code
    streams = [bodies(all_series, T0 + k * STEP) for k in range(args.intervals)]
    limit = 256 << 20
    url = soak.create_db(args.server, "fw_rwbench")
    try:
        soak.add_inventory(url, devices)
        engine = get_engine(url)
        results["remote write"] = []
        for k in range(args.intervals):
            def run(k: int = k) -> None:
                for b in streams[k]:
                    rep = rw.write(engine, rw.decompress(b, limit))
                    assert rep.stored.written + rep.stored.duplicates == rep.mapped.mapped, rep.mapped.report()
            cpu, wall = timed(run)
            results["remote write"].append((cpu, wall, per_interval))
        assert rw.TOTALS.written == per_interval * args.intervals, rw.TOTALS.to_dict()
        engine.dispose()
    finally:
        soak.drop_db(args.server, url)

    # 3. VictoriaMetrics, the same bodies over HTTP
    exe = shutil.which("victoria-metrics")
    if exe:
        work = tempfile.mkdtemp(prefix="fw-vm-")
        port = 18428
        proc = subprocess.Popen([exe, f"-storageDataPath={work}", f"-httpListenAddr=127.0.0.1:{port}",
                                 "-retentionPeriod=100y", "-loggerLevel=ERROR"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            ps = psutil.Process(proc.pid)
            results["VictoriaMetrics"] = []
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                for k in range(args.intervals):
                    c0, w0 = sum(ps.cpu_times()[:2]), time.perf_counter()
                    for b in streams[k]:
                        r = client.post("/api/v1/write", content=b, headers=HEADERS)
                        assert r.status_code == 204, r.text
                    results["VictoriaMetrics"].append((sum(ps.cpu_times()[:2]) - c0, time.perf_counter() - w0,
                                                       per_interval))
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(work, ignore_errors=True)

    # 4. exporter names through the mappings
    ex_series = exporter_series(devices)
    ex_streams = [bodies(ex_series, T0 + k * STEP) for k in range(args.intervals)]
    url = soak.create_db(args.server, "fw_rwbench")
    try:
        exporter_inventory(url, devices)
        engine = get_engine(url)
        rw.MAPPER.forget()
        results["rw, exporter names"] = []
        mapped = 0
        for k in range(args.intervals):
            before = rw.TOTALS.written

            def run_ex(k: int = k) -> None:
                for b in ex_streams[k]:
                    rw.write(engine, rw.decompress(b, limit))
            cpu, wall = timed(run_ex)
            mapped = rw.TOTALS.written - before
            results["rw, exporter names"].append((cpu, wall, len(ex_series)))
        print(f"# exporter names: {len(ex_series)} series an interval, {mapped} stored in the last; unmapped "
              f"{dict(rw.TOTALS.unmapped)}")
        engine.dispose()
    finally:
        soak.drop_db(args.server, url)

    print(f"{'path':20} {'first: samples/cpu-s':>22} {'steady: samples/cpu-s':>22} {'steady: samples/wall-s':>23}")
    steady = {}
    for name, rows in results.items():
        first = rows[0][2] / rows[0][0]
        rest = rows[1:] or rows
        cpu = sum(r[0] for r in rest)
        wall = sum(r[1] for r in rest)
        n = sum(r[2] for r in rest)
        steady[name] = n / cpu
        print(f"{name:20} {first:22,.0f} {n / cpu:22,.0f} {n / wall:23,.0f}")
    if "text import" in steady and "remote write" in steady:
        ratio = steady["remote write"] / steady["text import"]
        print(f"remote write / text import (steady, per CPU-second): {ratio:.2f}")
    if "VictoriaMetrics" in steady:
        print(f"remote write / VictoriaMetrics (steady, per CPU-second): "
              f"{steady['remote write'] / steady['VictoriaMetrics']:.3f}")


if __name__ == "__main__":
    main()
