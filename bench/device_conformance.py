"""Device conformance of the SNMP collector over the corpus of real walks.

    .venv/bin/python bench/device_conformance.py [--offline]

Serves every walk of tests/data/real/snmp with one snmpsim on 127.0.0.1 and polls them all with
the real collector (`--offline` maps the recordings directly instead), then scores each poll
against the hand-checked expectations of tests/data/snmp/conformance.toml:

- cells: the (platform, metric group) pairs with expected values; a cell is correct when every
  hand-checked value of it comes out right (and, for state, the number of ports is right);
- blind spots: what a device does not give, or gives and must not be used; a target passes when
  every one of its blind spots is reported in a warning of its group (none silent).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.base import Target
from collectors.snmp import collect_many, parse_snmprec_varbinds, samples_from_varbinds
from service.telemetry.samples import Sample
from tests.snmp_corpus import Score, load_walks, score
from tests.snmp_peers import start_snmpsim

NOW_MS = 1_700_000_000_000


def _polls(offline: bool) -> dict[str, tuple[list[Sample], list[str]]]:
    walks = load_walks()
    if offline:
        out = {}
        for w in walks:
            m = samples_from_varbinds(parse_snmprec_varbinds(w.path.read_text()), device=w.community, ts_ms=NOW_MS)
            out[w.community] = (m.samples, m.warnings)
        return out
    sim = start_snmpsim({w.community: w.path for w in walks})
    try:
        targets = [Target(name=w.community, device=w.community, protocol="snmp", port=sim.port,
                          secrets={"community": w.community}, timeout_s=3.0, retries=1) for w in walks]
        results = collect_many(targets, now_ms=NOW_MS)
    finally:
        sim.close()
    failed = [f"{r.target}: {r.error}" for r in results if not r.ok]
    if failed:
        raise SystemExit("polls failed:\n" + "\n".join(failed))
    return {r.target: (r.samples, r.warnings) for r in results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--offline", action="store_true", help="map the recordings without snmpsim")
    args = ap.parse_args()
    t0 = time.perf_counter()
    polls = _polls(args.offline)
    took = time.perf_counter() - t0
    scores: list[Score] = []
    for w in load_walks():
        samples, warnings = polls[w.community]
        ports = {s.port for s in samples if s.metric == "port_oper_up" and s.port}
        scores.append(score(w, samples, warnings, ports))

    print(f"{'platform':52} {'ports':>5}  {'cells correct':24} blind spots reported")
    for s in scores:
        cells = s.cells
        ok = [g for g, good in cells.items() if good]
        bad = [g for g, good in cells.items() if not good]
        cell_text = f"{len(ok)}/{len(cells)}" + (f" (wrong: {', '.join(bad)})" if bad else "")
        blind = len(s.walk.blind_spots)
        print(f"{s.walk.platform:52} {s.walk.ports:>5}  {cell_text:24} {blind - len(s.silent)}/{blind}"
              + (f"  silent: {'; '.join(s.silent)}" if s.silent else ""))
        for group, wrong in s.wrong.items():
            for line in wrong[:3]:
                print(f"    {group}: {line}")
    n_cells = sum(len(s.cells) for s in scores)
    good_cells = sum(sum(s.cells.values()) for s in scores)
    loud = sum(1 for s in scores if not s.silent)
    silent = sum(len(s.silent) for s in scores)
    print()
    print(f"cells with correct values: {good_cells}/{n_cells} ({100 * good_cells / n_cells:.1f} %)")
    print(f"targets whose blind spots are all reported: {loud}/{len(scores)} "
          f"({100 * loud / len(scores):.1f} %), silent blind spots: {silent}")
    print(f"{len(scores)} walks {'mapped offline' if args.offline else 'polled through snmpsim'} in {took:.1f} s")


if __name__ == "__main__":
    main()
