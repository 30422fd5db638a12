"""Benchmark: poll K simulated 64-port switches over SNMP v2c, anchored on net-snmp.

    .venv/bin/python bench/snmp_poll.py [--switches K] [--rounds N] [--max-repetitions R]

Each switch is an snmpsim recording built from the real Arista DCS-7150S-24 walk
(tests/data/snmp): the IF-MIB rows of Ethernet1 and the transceiver entity/sensor rows
of Ethernet21, repeated for Ethernet1..64 with varied counter values. The collector
polls all K at once (collect_many). The anchor is net-snmp `snmpbulkwalk` reading
the same columns from the same agent, one process per column, and its CPU comes from
the children's rusage. Values = varbinds received. Prints values/s and CPU seconds
per 1000 values for both, and the ratio (goal: at most 3x snmpbulkwalk).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors import snmp_oids as O
from collectors.base import Target
from collectors.snmp import collect_many, parse_snmprec_varbinds
from tests.snmp_peers import DATA, require, start_snmpsim

PORTS = 64
SRC = DATA / "arista_eos_4.20_dcs-7150s-24.snmprec"


def build_switch(seed: int) -> str:
    """A 64-port recording text, sorted by OID as snmpsim needs."""
    lines = SRC.read_text().splitlines()
    rows: dict[tuple[int, ...], str] = {}
    if_cols = {(*O.IF_ENTRY, c) for c in range(1, 23)} | {(*O.IFX_ENTRY, c) for c in range(1, 20)}
    for line in lines:
        oid_s, tag, value = line.split("|", 2)
        o = O.oid(oid_s)
        col, idx = o[:-1], o[-1]
        if col in if_cols and idx == 1:
            for p in range(1, PORTS + 1):
                v = value.replace("Ethernet1", f"Ethernet{p}")
                if tag in ("65", "70") and v.isdigit():
                    v = str(int(v) * p + seed)
                rows[(*col, p)] = f"{O.dotted((*col, p))}|{tag}|{v}"
        elif (o[: len(O.ENT_PHYS_ENTRY)] == O.ENT_PHYS_ENTRY or o[: len(O.ENT_SENSOR_ENTRY)]
              == O.ENT_SENSOR_ENTRY) and 100321000 <= idx < 100322000:
            for p in range(1, PORTS + 1):
                new_idx = 100300000 + p * 1000 + (idx - 100321000)
                v = value.replace("Ethernet21", f"Ethernet{p}")
                if o[: len(O.ENT_PHYS_ENTRY)] == O.ENT_PHYS_ENTRY and tag == "2" and v.startswith("10032"):
                    v = str(100300000 + p * 1000 + (int(v) - 100321000))  # entPhysicalContainedIn
                rows[(*col, new_idx)] = f"{O.dotted((*col, new_idx))}|{tag}|{v}"
    return "\n".join(rows[k] for k in sorted(rows)) + "\n"


def walked_columns() -> list[tuple[int, ...]]:
    return [c for g in O.WALK_GROUPS.values() for c in g]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--switches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-repetitions", type=int, default=25)
    args = ap.parse_args()
    walk = require("snmpbulkwalk", "the Debian package snmp")

    with tempfile.TemporaryDirectory(prefix="fw-bench-") as tmp:
        recs = {}
        for k in range(args.switches):
            path = Path(tmp) / f"sw{k}.snmprec"
            path.write_text(build_switch(k))
            recs[f"sw{k}"] = path
        cols = set(walked_columns())
        per_switch = sum(1 for o, _, _ in parse_snmprec_varbinds(recs["sw0"].read_text())
                         if any(o[: len(c)] == c for c in cols))
        peer = start_snmpsim(recs, max_var_binds=1024)
        try:
            targets = [Target(name=f"sw{k}", device=f"sw{k}", protocol="snmp", port=peer.port,
                              secrets={"community": f"sw{k}"}, timeout_s=10, retries=1,
                              params={"max_repetitions": args.max_repetitions})
                       for k in range(args.switches)]
            collect_many(targets[:1], now_ms=0)  # warm-up: imports, snmpsim index
            cpu0, wall0 = time.process_time(), time.perf_counter()
            samples = 0
            for r in range(args.rounds):
                results = collect_many(targets, now_ms=r)
                bad = [x.error for x in results if not x.ok]
                if bad:
                    raise SystemExit(f"poll failed: {bad[0]}")
                samples += sum(len(x.samples) for x in results)
            ours_cpu, ours_wall = time.process_time() - cpu0, time.perf_counter() - wall0
            ours_values = per_switch * args.switches * args.rounds

            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall0 = time.perf_counter()
            for _ in range(args.rounds):
                for k in range(args.switches):
                    for c in walked_columns():
                        subprocess.run([walk, "-v2c", "-c", f"sw{k}", f"-Cr{args.max_repetitions}", "-On",
                                        "-Oq", "-t", "10", f"127.0.0.1:{peer.port}", O.dotted(c)],
                                       check=True, stdout=subprocess.DEVNULL)
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            ref_wall = time.perf_counter() - wall0
            ref_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            # Second anchor without process start-up per column: one walk of the whole
            # recording (the walked columns plus system) per switch.
            for _ in range(args.rounds):
                for k in range(args.switches):
                    subprocess.run([walk, "-v2c", "-c", f"sw{k}", f"-Cr{args.max_repetitions}", "-On", "-Oq",
                                    "-t", "10", f"127.0.0.1:{peer.port}", "1.3.6.1"],
                                   check=True, stdout=subprocess.DEVNULL)
            ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
            whole_cpu = (ru2.ru_utime - ru1.ru_utime) + (ru2.ru_stime - ru1.ru_stime)
            whole_values = len(recs["sw0"].read_text().splitlines()) * args.switches * args.rounds
        finally:
            peer.close()

    ours = ours_cpu / ours_values * 1000
    ref = ref_cpu / ours_values * 1000
    print(f"switches={args.switches} ports/switch={PORTS} rounds={args.rounds} "
          f"max_repetitions={args.max_repetitions} values/poll/switch={per_switch} samples={samples}")
    print(f"fabricwatch collect_many : {ours_values / ours_wall:9.0f} values/s wall, "
          f"{ours:.4f} CPU s per 1000 values ({ours_cpu:.2f}s CPU, {ours_wall:.2f}s wall)")
    print(f"net-snmp snmpbulkwalk   : {ours_values / ref_wall:9.0f} values/s wall, "
          f"{ref:.4f} CPU s per 1000 values ({ref_cpu:.2f}s CPU incl. one process per column)")
    whole = whole_cpu / whole_values * 1000
    print(f"net-snmp, one walk/switch: {whole:.4f} CPU s per 1000 values ({whole_values} values)")
    print(f"CPU ratio ours/snmpbulkwalk = {ours / ref:.1f}x per-column walks, {ours / whole:.1f}x against "
          "one walk per switch (goal <= 3x); wall time is bound by snmpsim, a pure-Python agent")


if __name__ == "__main__":
    main()
