"""Device conformance over the corpus of real captures: SNMP walks, then host outputs.

    .venv/bin/python bench/device_conformance.py [--offline]

Serves every walk of tests/data/real/snmp with one snmpsim on 127.0.0.1 and polls them all with
the real collector (`--offline` maps the recordings directly instead), then scores each poll
against the hand-checked expectations of tests/data/snmp/conformance.toml:

- cells: the (platform, metric group) pairs with expected values; a cell is correct when every
  hand-checked value of it comes out right (and, for state, the number of ports is right);
- blind spots: what a device does not give, or gives and must not be used; a target passes when
  every one of its blind spots is reported in a warning of its group (none silent);
- coverage: the same poll through the coverage record the store step writes (service/telemetry/coverage.py,
  with the inventory listing every port and an optic on each: a switch polled over SNMP expects state,
  counters and optics). A target passes when each of its blind spots is in the record (a group's reason
  or its blind-spot warnings) and each group the walk cannot show (`unsupported`) is a missing group or
  has a blind spot there; a group reported missing that the walk does have values for is a false gap.

Then the gNMI captures (tests/gnmi_corpus.py): a capture with hand-checked values is correct when every
check holds; one the parser must refuse (invalid JSON as published, no timestamp, nothing it maps) is
reported when the ParseError names the capture and the reason.

Then the host corpus (tests/host_corpus.py: ethtool -S and -m, RDMA sysfs, rdma statistic, perfquery):
a cell is a (source, metric group) pair of the Hosts table in docs/devices.md; it is correct when every
hand-checked value of every capture behind it comes out right. Its blind spots are the captures that must
give no reading (all-zero or garbled DOM): reported when nothing is read and a warning says why.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.base import CollectResult, ParseError, Target
from collectors.gnmi import parse_gnmi_json
from collectors.snmp import collect_many, parse_snmprec_varbinds, samples_from_varbinds
from service.telemetry.coverage import COVERAGE_GROUPS, assess, expected_groups, state_of, summarize
from service.telemetry.ingest import IngestReport
from service.telemetry.samples import Sample
from tests.gnmi_corpus import EXPECTED, GNMI
from tests.host_corpus import CASES, mismatches
from tests.snmp_corpus import Score, Walk, load_walks, score
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


def coverage_silent(walk: Walk, samples: list[Sample], warnings: list[str]) -> tuple[list[str], list[str], bool]:
    """(blind spots the coverage record does not carry, groups it calls missing that the walk has values for,
    whether the target's state is `degraded`)."""
    record = assess(CollectResult(walk.community, samples=samples, warnings=warnings), IngestReport(),
                    polled=["counters", "optics", "state"], previous=None, at_ms=NOW_MS,
                    expected=expected_groups(kind="switch", protocol="snmp", optics=True))
    cov = summarize(record)
    assert cov is not None

    def said(group: str) -> list[str]:
        reason = cov["groups"].get(group, {}).get("reason")
        return ([reason] if reason else []) + cov["blind_spots"].get(group, [])

    silent = [f"{g}: {t}" for g, t in walk.blind_spots if not any(t in w for w in said(g))]
    silent += [f"{g}: not reported (unsupported: {why})" for g, why in walk.unsupported.items()
               if g in COVERAGE_GROUPS and g not in cov["missing"] and not said(g)]
    false_gaps = [g for g in cov["missing"] if g in walk.expect]
    return silent, false_gaps, state_of(cov, stored=len(samples), warnings=warnings) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--offline", action="store_true", help="map the recordings without snmpsim")
    args = ap.parse_args()
    t0 = time.perf_counter()
    polls = _polls(args.offline)
    took = time.perf_counter() - t0
    scores: list[Score] = []
    coverage: dict[str, tuple[list[str], list[str], bool]] = {}
    for w in load_walks():
        samples, warnings = polls[w.community]
        ports = {s.port for s in samples if s.metric == "port_oper_up" and s.port}
        scores.append(score(w, samples, warnings, ports))
        coverage[w.community] = coverage_silent(w, samples, warnings)

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
        cov_silent, false_gaps, _ = coverage[s.walk.community]
        for line in cov_silent:
            print(f"    coverage record silent on {line}")
        for g in false_gaps:
            print(f"    coverage record calls {g} missing, but the walk has {g} values")
    n_cells = sum(len(s.cells) for s in scores)
    good_cells = sum(sum(s.cells.values()) for s in scores)
    loud = sum(1 for s in scores if not s.silent)
    silent = sum(len(s.silent) for s in scores)
    print()
    print(f"cells with correct values: {good_cells}/{n_cells} ({100 * good_cells / n_cells:.1f} %)")
    print(f"targets whose blind spots are all reported: {loud}/{len(scores)} "
          f"({100 * loud / len(scores):.1f} %), silent blind spots: {silent}")
    cov_loud = sum(1 for silent, false, _ in coverage.values() if not silent and not false)
    cov_silent = sum(len(silent) for silent, _, _ in coverage.values())
    cov_false = sum(len(false) for _, false, _ in coverage.values())
    print(f"targets whose blind spots are reported through the coverage record: {cov_loud}/{len(scores)} "
          f"({100 * cov_loud / len(scores):.1f} %), silent: {cov_silent}, false gaps: {cov_false}")
    # a whole group the walk cannot show: its target must not read `ok`
    whole = [w for w in load_walks() if set(w.unsupported) & set(COVERAGE_GROUPS)]
    shown = sum(coverage[w.community][2] for w in whole)
    before = sum(not polls[w.community][0] for w in whole)   # the old rule: degraded only when nothing was stored
    print(f"targets missing a whole expected group shown degraded: {shown}/{len(whole)} "
          f"(with the rule before coverage, degraded only when nothing was stored: {before}/{len(whole)})")
    print(f"{len(scores)} walks {'mapped offline' if args.offline else 'polled through snmpsim'} in {took:.1f} s")
    gnmi_captures()
    hosts()


def gnmi_captures() -> None:
    """Every real gNMI capture: hand-checked values, or refused with its reason."""
    checked = good = refused = loud = 0
    for name, want in sorted(EXPECTED.items()):
        text = (GNMI / name).read_text()
        if isinstance(want, str):
            refused += 1
            try:
                parse_gnmi_json(text, device="sw1", source=name)
                print(f"    {name}: parsed, but must be refused ({want})")
            except ParseError as e:
                ok = want in str(e) and name in str(e)
                loud += ok
                if not ok:
                    print(f"    {name}: refused with {e}, want {want!r}")
            continue
        checked += 1
        try:
            want(parse_gnmi_json(text, device="sw1", source=name))
            good += 1
        except (AssertionError, ParseError) as e:
            print(f"    {name}: wrong: {e!r}"[:300])
    print()
    print(f"gNMI captures with correct values: {good}/{checked} ({100 * good / max(1, checked):.1f} %); "
          f"captures refused with their reason: {loud}/{refused}")


def hosts() -> None:
    """The host corpus: (source, group) cells and no-reading captures."""
    t0 = time.perf_counter()
    wrong: dict[tuple[str, str], list[str]] = {}
    blind = blind_ok = 0
    for case in CASES:
        bad = mismatches(case)
        wrong.setdefault((case.source, case.group), []).extend(f"{case.path}: {b}" for b in bad)
        if not case.expect:
            blind += 1
            blind_ok += not bad
    took = time.perf_counter() - t0
    good = [c for c, w in wrong.items() if not w]
    print()
    print(f"hosts: {len({c.path for c in CASES})} captures, {len(wrong)} (source, group) cells, "
          f"{len({s for s, _ in wrong})} sources")
    for (source, group), lines in wrong.items():
        for line in lines[:3]:
            print(f"    {source} / {group}: {line}")
    print(f"host cells with correct values: {len(good)}/{len(wrong)} ({100 * len(good) / len(wrong):.1f} %)")
    print(f"host captures that must give no reading, reported: {blind_ok}/{blind} "
          f"({100 * blind_ok / max(1, blind):.1f} %), silent: {blind - blind_ok}")
    print(f"{len(CASES)} host rows parsed in {took:.2f} s")


if __name__ == "__main__":
    main()
