"""Shared-component and BER persistence count observations in data time, not cycles (issue #23).

The same crafted series (a line card with post-FEC errors on 5 of a leaf's 16 ports; a pre-FEC BER rise on one
port, near the FEC limit or 2 decades over its own baseline) is read by cycles every 60 s and at longer steps and
other phases. The condition must fire at every step, and on the first cycle that has read the data on which the
60 s cycles fired, give or take one poll: a 15 min cycle over 60 s polls brings 15 observations, as fifteen
60 s cycles do. (Before, both counted one observation per cycle: at a 15 min step the line card fired on the
second cycle after its onset and the BER rise on the third.)
"""

from __future__ import annotations

import numpy as np
import pytest

from service.detection.findings import Finding
from tests.detection.crafted import Driver, firing

WARM_MIN = 60      # healthy data before the fault (baselines)
FAULT_MIN = 47     # the fault starts this many minutes later: off every coarse step's grid
END_MIN = 150


def _run(poll_s: int, step_s: int, phase_s: int, fault: str) -> tuple[list[Finding], list[int], int]:
    """Polls every `poll_s`, cycles every `step_s` (1 s after a poll, shifted by `phase_s`); the fault from
    WARM_MIN + FAULT_MIN. Returns the findings, the cycle times and the fault's onset (ms)."""
    d = Driver(step_ms=poll_s * 1000)
    P = d.fab.P
    leaf = [d.port("leaf", f"Ethernet1/{k}") for k in (1, 4, 7, 10, 13)]
    ber_port = d.port("h2", "eth1")
    onset = d.t + (WARM_MIN + FAULT_MIN) * 60_000
    out: list[Finding] = []
    cycles: list[int] = []
    k = 0
    while d.t < onset + (END_MIN - WARM_MIN - FAULT_MIN) * 60_000:
        inc: dict[str, np.ndarray] = {}
        if d.t + d.step_ms > onset:  # this poll's interval is (partly) after the onset
            x = np.zeros(P)
            if fault == "line_card":
                x[leaf] = 30 * poll_s / 60
                inc["port_fec_uncorrectable_codewords_total"] = x
            else:
                ber = 3e-5 if fault == "ber_near_limit" else 1e-6
                x[ber_port] = 400e9 * poll_s * (ber - 1e-8)
                inc["port_fec_corrected_bits_total"] = x
        d.step(inc=inc)
        k += 1
        if (k * poll_s - phase_s) % step_s == 0:
            cycles.append(d.t + 1000)
            out += d.eng.run_cycle(d.st, cycles[-1])
    return out, cycles, onset


def _first(out: list[Finding], kind: str) -> int | None:
    f = firing(out, kind)
    return min(x.at_ms for x in f) if f else None


@pytest.mark.parametrize("fault", ["line_card", "ber_near_limit", "ber_over_baseline"])
@pytest.mark.parametrize("poll_s", [60, 300])
def test_shifting_the_cycle_step_does_not_change_whether_or_when_it_fires(fault: str, poll_s: int) -> None:
    kind = "shared_component" if fault == "line_card" else "ber_degradation"
    base, _, onset = _run(poll_s, poll_s, 0, fault)
    t_ref = _first(base, kind)
    assert t_ref is not None and t_ref >= onset
    assert {f.kind for f in firing(base)} == {kind}  # one device finding, no per-port pages; BER alone
    poll_ms = poll_s * 1000
    for step_s in sorted({60, 300, 600, 900} - {poll_s}):
        if step_s % poll_s:
            continue
        for phase_s in sorted({0, poll_s * (step_s // poll_s // 2)}):
            out, cycles, _ = _run(poll_s, step_s, phase_s, fault)
            got = _first(out, kind)
            assert got is not None, (step_s, phase_s)
            # not before the data the 60 s cycles fired on (give or take a poll), and on the first cycle that has
            # read one poll past it at the latest
            by = min(c for c in cycles if c >= t_ref + poll_ms)
            assert t_ref - poll_ms <= got <= by, (step_s, phase_s, (got - t_ref) / 1000, (by - t_ref) / 1000)
            assert {f.kind for f in firing(out)} == {kind}
