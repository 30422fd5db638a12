"""Pause-storm and congestion persistence count rate windows in data time, not cycles (issue #23).

As tests/detection/test_step_shift.py does for the line card and BER: a NIC pause storm (S9-like: a host port's
tx pause duty ~1 on one priority while it drains ~nothing) and a congestion episode (S7-like: 10 % of rx packets
ECN-marked and 10 % tx pause duty, traffic flowing) are read by cycles at the poll step and at longer steps and
other phases. Each must fire at every step, on the first cycle that has read one poll past the data the poll-step
cycles fired on, and congestion must stay an INFO label (nothing physical, no pause storm). A 15 min cycle over
60 s polls brings 15 pause-duty and ECN-share observations, as fifteen 60 s cycles do. (Before, both counted one
observation per cycle: congestion, 3 of 5, waited for the third cycle after its onset, 30-45 min at a 15 min
step instead of 3 min.)
"""

from __future__ import annotations

import numpy as np
import pytest

from service.detection.findings import Cause, Finding, Severity
from tests.detection.crafted import Driver, firing
from tests.detection.test_step_shift import _first

WARM_MIN = 60      # healthy data before the episode (baselines)
FAULT_MIN = 47     # the episode starts this many minutes later: off every coarse step's grid
END_MIN = 150
RX_BYTES_PER_S = 400e9 / 8 * 0.3   # the Driver's healthy rx traffic
RX_PKTS_PER_S = RX_BYTES_PER_S / 4096


def _run(poll_s: int, step_s: int, phase_s: int, fault: str, polls: int | None = None
         ) -> tuple[list[Finding], list[int], int]:
    """Polls every `poll_s`, cycles every `step_s` (1 s after a poll, shifted by `phase_s`); the episode from
    WARM_MIN + FAULT_MIN, for `polls` polls (None: to the end). Returns the findings, the cycle times and the
    episode's onset (ms)."""
    d = Driver(step_ms=poll_s * 1000)
    P = d.fab.P
    host = d.port("h2", "eth1")
    onset = d.t + (WARM_MIN + FAULT_MIN) * 60_000
    out: list[Finding] = []
    cycles: list[int] = []
    k = 0
    while d.t < onset + (END_MIN + (60 if polls else 0) - WARM_MIN - FAULT_MIN) * 60_000:
        inc: dict[str, np.ndarray] = {}
        prio: dict[str, np.ndarray] = {}
        end = onset + (polls * d.step_ms if polls else 10**15)
        if d.t + d.step_ms > onset and d.t < end:  # this poll's interval is (partly) in the episode
            pause, x = np.zeros(P), np.zeros(P)
            if fault == "pause_storm":
                pause[host] = poll_s * 0.995          # paused ~all the interval on one priority
                x[host] = -RX_BYTES_PER_S * poll_s * 0.999  # and draining ~nothing
                inc["port_rx_bytes_total"] = x
            else:
                pause[host] = poll_s * 0.1            # pausing 10 % of the time, traffic flowing
                x[host] = RX_PKTS_PER_S * poll_s * 0.1  # 10 % of rx packets ECN-marked
                inc["port_ecn_marked_packets_total"] = x
            prio["port_pfc_tx_pause_seconds_total"] = pause
        d.step(inc=inc, prio_inc=prio)
        k += 1
        if (k * poll_s - phase_s) % step_s == 0:
            cycles.append(d.t + 1000)
            out += d.eng.run_cycle(d.st, cycles[-1])
    return out, cycles, onset


def _check(out: list[Finding], kind: str) -> None:
    """The episode is its own finding on the host port and nothing else alerts; congestion is a label."""
    assert {f.kind for f in firing(out)} == {kind}
    assert {(f.device, f.port) for f in firing(out)} == {("h2", "eth1")}
    assert not [f for f in out if f.physical]
    if kind == "congestion":
        assert all(f.cause is Cause.CONGESTION and f.severity is Severity.INFO for f in out)
    else:
        assert all(f.cause is Cause.NIC_PAUSE_STORM for f in firing(out))


@pytest.mark.parametrize("fault", ["pause_storm", "congestion"])
@pytest.mark.parametrize("poll_s", [60, 300])
def test_shifting_the_cycle_step_does_not_change_whether_or_when_it_fires(fault: str, poll_s: int) -> None:
    base, _, onset = _run(poll_s, poll_s, 0, fault)
    t_ref = _first(base, fault)
    assert t_ref is not None and t_ref >= onset
    _check(base, fault)
    poll_ms = poll_s * 1000
    for step_s in sorted({60, 120, 300, 600, 900} - {poll_s}):
        if step_s % poll_s:
            continue
        for phase_s in sorted({0, poll_s * (step_s // poll_s // 2)}):
            out, cycles, _ = _run(poll_s, step_s, phase_s, fault)
            got = _first(out, fault)
            assert got is not None, (step_s, phase_s)
            # not before the data the poll-step cycles fired on (give or take a poll), and on the first cycle that
            # has read one poll past it at the latest
            by = min(c for c in cycles if c >= t_ref + poll_ms)
            assert t_ref - poll_ms <= got <= by, (step_s, phase_s, (got - t_ref) / 1000, (by - t_ref) / 1000)
            _check(out, fault)


def _ended(out: list[Finding], cycles: list[int], kind: str) -> int | None:
    """The first cycle after the finding fired that no longer reports it (firing or holding)."""
    t_fire = _first(out, kind)
    shown = {f.at_ms for f in out if f.kind == kind}
    return min((c for c in cycles if t_fire is not None and c > t_fire and c not in shown), default=None)


@pytest.mark.parametrize("poll_s", [60, 300])
def test_a_short_pause_storm_ends_in_the_same_data_time_at_any_step(poll_s: int) -> None:
    """A storm of 3 polls inside a long cycle is seen (the cycle's highest-duty windows count) and its alert ends
    once 2 observations (1 of 2) have read no storm: the cycle after the first one that read one poll past where
    the poll-step cycles ended it, at the latest. Counting one observation per cycle, a 15 min cycle kept it open
    for two cycles after the storm: 45 min."""
    base, base_cycles, onset = _run(poll_s, poll_s, 0, "pause_storm", polls=3)
    t_end = _ended(base, base_cycles, "pause_storm")
    assert _first(base, "pause_storm") is not None and t_end is not None and t_end > onset
    poll_ms = poll_s * 1000
    for step_s in sorted({120, 300, 600, 900} - {poll_s}):
        if step_s % poll_s:
            continue
        for phase_s in sorted({0, poll_s * (step_s // poll_s // 2)}):
            out, cycles, _ = _run(poll_s, step_s, phase_s, "pause_storm", polls=3)
            assert _first(out, "pause_storm") is not None, (step_s, phase_s)
            got = _ended(out, cycles, "pause_storm")
            read_past = min(c for c in cycles if c >= t_end + poll_ms)
            by = min(c for c in cycles if c > read_past)
            assert got is not None and t_end - poll_ms <= got <= by, (step_s, phase_s, got and (got - t_end) / 1000,
                                                                      (by - t_end) / 1000)
            _check(out, "pause_storm")
