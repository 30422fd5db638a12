"""How many gNMI updates per second the collector decodes into canonical samples.

Two figures:
  stream  - end to end: a STREAM/SAMPLE subscription against simulator/gnmi_target.py
            running in a separate process (so the target's Python does not share our GIL);
  decode  - the client's own ceiling: the same SubscribeResponses, already serialised,
            parsed + decoded + mapped with no network in between.

    .venv/bin/python bench/gnmi_stream.py [--ports 256] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygnmi.spec.v080 import gnmi_pb2

from collectors.base import Target
from collectors.gnmi import stream_gnmi
from collectors.gnmi_decode import notification_leaves
from collectors.gnmi_paths import map_notification
from service.telemetry.samples import Sample

COUNTERS = ("in-octets", "out-octets", "in-pkts", "out-pkts", "in-errors", "out-errors",
            "in-discards", "out-discards", "in-fcs-errors", "carrier-transitions")


def provider_for(ports: int) -> Any:
    state = {"n": 0}

    def provider() -> dict[str, Any]:
        state["n"] += 1
        n = state["n"]
        return {f"/interfaces/interface[name=Ethernet{p}]/state/counters/{c}": n * 1000 + p
                for p in range(1, ports + 1) for c in COUNTERS}

    return provider


def _serve(ports: int, conn: Any) -> None:
    from simulator.gnmi_target import serve_gnmi

    with serve_gnmi(provider_for(ports)) as (port, _):
        conn.send(port)
        conn.recv()  # until the parent says stop


def bench_stream(ports: int, seconds: float, interval_s: float) -> float:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_serve, args=(ports, child), daemon=True)
    proc.start()
    port = parent.recv()
    target = Target(name="bench", device="bench-sw", protocol="gnmi", port=port,
                    params={"tls": False, "sample_interval_s": interval_s,
                            "path_set": "openconfig"})
    count = 0
    first: float | None = None

    def on_samples(batch: list[Sample]) -> None:
        nonlocal count, first
        if first is None:
            first = time.perf_counter()  # start after the initial snapshot arrived
            return
        count += len(batch)

    stop = threading.Event()
    th = threading.Thread(target=stream_gnmi, args=(target, on_samples, stop), daemon=True)
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join(5)
    elapsed = time.perf_counter() - (first or time.perf_counter())
    parent.send("stop")
    proc.join(5)
    return count / elapsed if elapsed > 0 else 0.0


def bench_decode(ports: int, rounds: int) -> float:
    from collectors.gnmi_decode import path_to_proto
    from simulator.gnmi_target import to_typed_value

    data = provider_for(ports)()
    note = gnmi_pb2.Notification(timestamp=time.time_ns(), update=[
        gnmi_pb2.Update(path=path_to_proto(p), val=to_typed_value(v)) for p, v in data.items()])
    wire = gnmi_pb2.SubscribeResponse(update=note).SerializeToString()
    t0 = time.perf_counter()
    n = 0
    for _ in range(rounds):
        resp = gnmi_pb2.SubscribeResponse.FromString(wire)
        leaves, _ = notification_leaves(resp.update)
        n += len(map_notification(leaves, device="bench-sw").samples)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ports", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=0.01, help="sample interval, seconds")
    args = ap.parse_args()
    leaves = args.ports * len(COUNTERS)
    print(f"{args.ports} ports x {len(COUNTERS)} counters = {leaves} updates per notification")
    print(f"decode  {bench_decode(args.ports, 20):>12,.0f} updates/s (parse + decode + map, no network)")
    print(f"stream  {bench_stream(args.ports, args.seconds, args.interval):>12,.0f} updates/s "
          f"(STREAM SAMPLE every {args.interval}s, target in another process)")


if __name__ == "__main__":
    main()
