"""One-shot NVML check on a real GPU machine: run collect_nvml, print the samples and timings.

Usage (from the repository root, on a host with the NVIDIA driver):
    python bench/gpu/nvml_check.py [--polls N] [--interval S]

It prints what the real driver returns for each canonical GPU metric, the warnings (fields
NVML refused), and how long a poll takes, so the fake-pynvml unit tests can be compared with
the real API's behaviour. Exit status 1 if NVML cannot be initialised.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml

from collectors.base import CollectError
from collectors.host.nvml import collect_nvml


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    try:
        pynvml.nvmlInit()
        print(f"driver {pynvml.nvmlSystemGetDriverVersion()}  nvml {pynvml.nvmlSystemGetNVMLVersion()}")
        for i in range(pynvml.nvmlDeviceGetCount()):
            print(f"gpu {i}: {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))}")
    except pynvml.NVMLError as exc:
        print(f"NVML unavailable: {exc}")
        return 1
    for n in range(args.polls):
        warnings: list[str] = []
        t0 = time.perf_counter()
        try:
            samples = collect_nvml(device="nvml-check", ts_ms=int(time.time() * 1000), warnings=warnings)
        except CollectError as exc:
            print(f"poll {n}: CollectError: {exc}")
            return 1
        dt = time.perf_counter() - t0
        print(f"poll {n}: {len(samples)} samples in {dt * 1000:.1f} ms")
        for s in samples:
            print(f"  gpu={s.gpu} {s.metric} = {s.value:g}" + (f" (bits={s.counter_bits})" if s.counter_bits else ""))
        for w in warnings:
            print(f"  warning: {w}")
        if n + 1 < args.polls:
            time.sleep(args.interval)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
