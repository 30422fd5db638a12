"""Optics polled more often than port state (issue #23, cell counters=300 x optics=60): a port shut between two state
polls reads dark optics (its laser off, no light at the far receiver) minutes before a state reading says why.

The eval's confounders suite at that cadence paged and ticketed its S12 admin-down port: the DOM rule (tx under the
low alarm) and the optical rule at the far receiver (rx gone, far tx gone: transmitter wear-out) fired on 2-3 fresh
optics observations against an admin/oper status still held from before the shutdown. No light is the port
state's to explain (admin-down, link down), so a dark reading newer than the port's state waits for it.
"""

from __future__ import annotations

import numpy as np

from service.detection.findings import Finding
from tests.detection.crafted import T0, Driver, firing

DARK = -40.0  # what a module reads with no light (0 mW), as a shut laser's tx does
STATE_EVERY = 5  # port state and counters every 5 min, optics every minute, a cycle after each optics poll
OPTICS = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
          "optic_voltage_volts"}


def _run(d: Driver, steps: int, **kw: object) -> list[Finding]:
    """`steps` optics polls a minute apart; port state, PCIe and counters only on every STATE_EVERY-th."""
    others = set(d.counters) | set(d.prio) | {"port_oper_up", "port_admin_up", "gpu_pcie_link_width"}
    out: list[Finding] = []
    for _ in range(steps):
        state_poll = (d.t - T0) // d.step_ms % STATE_EVERY == STATE_EVERY - 1
        d.step(drop=None if state_poll else others, **kw)  # type: ignore[arg-type]
        out += d.cycle()
    return out


def _driver() -> Driver:
    d = Driver(seed=3)
    _run(d, 40)  # warm: baselines, every cadence seen; the next step is the first after a state poll
    assert (d.t - T0) // d.step_ms % STATE_EVERY == 0
    return d


def _lanes(d: Driver, p: int) -> np.ndarray:
    return np.arange(d.fab.lane_off[p], d.fab.lane_off[p + 1])


def test_a_port_shut_between_state_polls_raises_nothing_before_its_state_is_read() -> None:
    """leaf:Ethernet1/3 is shut a minute after a state poll: its tx reads dark and h0:eth2 (the far end) receives
    nothing for 4 optics polls before the state poll says admin-down / oper-down, then for an hour. Nothing
    alerts: not the shut module's tx low alarm, not the far receiver's lost light (before the fix: dom_threshold
    and a transmitter_wearout page on the shut port). A lit 3 dB drop elsewhere, at the same moment, still fires
    on its third optics poll: only darkness waits for the port state."""
    d = _driver()
    p = d.port("leaf", "Ethernet1/3")
    q = int(d.fab.peer[p])
    r = d.port("leaf", "Ethernet1/9")
    d.admin[p] = 0.0
    d.oper[[p, q]] = 0.0
    d.tx[_lanes(d, p)] = DARK
    rx = d.rx.copy()
    rx[_lanes(d, q)] = DARK
    rx[d.fab.lane_off[r] + 1] -= 3.0  # a dirty connector on another link, lit
    out = _run(d, 60, rx=rx)
    alarms = [f for f in firing(out) if f.severity.value != "info"]
    assert {(f.kind, f.device, f.port) for f in alarms} == {("optical_degradation", "leaf", "Ethernet1/9")}, \
        sorted({(f.kind, f.device, f.port, f.cause.value) for f in alarms})
    first = min(f.at_ms for f in alarms)
    assert first == T0 + 43 * d.step_ms  # the third optics poll of the drop


def test_a_dark_lane_on_a_port_that_stays_up_is_judged_once_the_state_is_read() -> None:
    """A lane going dark on a port whose next state reading still says up (admin and oper) is not explained by
    port state: the optical rule judges it from that reading on, so waiting delays it by at most one state poll
    and never hides it."""
    d = _driver()
    p = d.port("leaf", "Ethernet1/6")
    rx = d.rx.copy()
    rx[d.fab.lane_off[p] + 2] = DARK
    out = _run(d, 15, rx=rx)
    f = firing(out, "optical_degradation")
    assert f and {(x.device, x.port) for x in f} == {("leaf", "Ethernet1/6")}
    # the state poll at the 5th minute answers; three optics observations from there (5, 6, 7)
    assert min(x.at_ms for x in f) == T0 + 47 * d.step_ms


def test_a_port_shut_for_an_hour_and_enabled_again_raises_nothing_at_a_five_minute_step() -> None:
    """The eval's S12 admin-down port at counters every 5 min, optics every minute and a cycle every 5 min (#23,
    cell 300x60 at the counter step: a dom_threshold ticket and a fiber_damage page on the port, 4 minutes after
    it was enabled again). The cycle that reads the state poll saying the port is up again also reads the dark
    optics polls made before it: they are the shut port's, not its optics' state, and raise nothing."""
    d = _driver()
    p = d.port("leaf", "Ethernet1/3")
    q = int(d.fab.peer[p])
    out: list[Finding] = []
    others = set(d.counters) | set(d.prio) | {"port_oper_up", "port_admin_up", "gpu_pcie_link_width"}

    def polls(n: int, **kw: object) -> None:
        nonlocal out
        for _ in range(n):
            state_poll = (d.t - T0) // d.step_ms % STATE_EVERY == STATE_EVERY - 1
            d.step(drop=None if state_poll else others, **kw)  # type: ignore[arg-type]
            if state_poll:
                out += d.cycle()

    polls(2)
    d.admin[p], d.oper[[p, q]] = 0.0, 0.0
    tx_lit = d.tx[_lanes(d, p)].copy()
    d.tx[_lanes(d, p)] = DARK
    rx = d.rx.copy()
    rx[_lanes(d, q)] = DARK
    polls(61, rx=rx)  # an hour shut; re-enabled 3 minutes after a state poll
    d.admin[p], d.oper[[p, q]] = 1.0, 1.0
    d.tx[_lanes(d, p)] = tx_lit
    polls(30)
    alarms = [f for f in firing(out) if f.severity.value != "info"]
    assert alarms == [], sorted({(f.kind, f.device, f.port, f.cause.value) for f in alarms})
