"""Observations, not cycles (issue #23), on small crafted series: a cycle without new data leaves a condition as it
was, storms are counted in data time, ON_CHANGE state between polls counts, a metric that stops ages out."""

from __future__ import annotations

import numpy as np

from service.detection.engine import Engine
from service.detection.state import FeatureState
from tests.detection.crafted import T0, Driver, firing, tiny_fabric


def _polls_and_cycles(d: Driver, polls: int, cycles_per_poll: int, inc: dict | None = None, **kw: object) -> list:
    """`polls` polls of every metric (Driver.step), each followed by `cycles_per_poll` cycles a minute apart."""
    out = []
    for _ in range(polls):
        d.step(inc=inc, **kw)  # type: ignore[arg-type]
        poll = d.t
        for c in range(cycles_per_poll):
            out += d.eng.run_cycle(d.st, poll + 1000 + c * 60_000)
    return out


def test_post_fec_in_two_of_three_polls_fires_however_many_cycles_lie_between() -> None:
    """Counters every 5 min, a cycle every minute: the errors are in 2 of the last 3 observations, so post-FEC
    fires; the four cycles between polls neither count as 'no errors' nor age the history (the old k-of-n over
    cycles saw errors in 2 of 10 cycles and never fired)."""
    d = Driver(step_ms=300_000)
    _polls_and_cycles(d, 6, 5)
    p = d.port("h1", "eth2")
    err = np.zeros(d.fab.P)
    err[p] = 40
    out = _polls_and_cycles(d, 1, 5, inc={"port_fec_uncorrectable_codewords_total": err})
    out += _polls_and_cycles(d, 1, 5)
    assert firing(out) == []  # one observation with errors is not yet two
    out = _polls_and_cycles(d, 1, 5, inc={"port_fec_uncorrectable_codewords_total": err})
    f = firing(out, "post_fec_errors")
    assert len(f) == 5 and {(x.device, x.port) for x in f} == {("h1", "eth2")}  # and every cycle until new data
    onset = {e.feature: e.value for e in f[0].evidence}["onset_ms"]
    assert onset == d.t - 2 * 300_000  # the first observation with errors, in data time


def test_a_storm_split_over_5_min_polls_is_a_storm() -> None:
    """1-2 flaps per 5 min poll, 5 within 30 min: a storm; the same 4 flaps spread over 40 min are not."""
    d = Driver(step_ms=300_000)
    _polls_and_cycles(d, 4, 5)
    p = d.port("leaf", "Ethernet1/3")
    link = np.zeros(d.fab.P)
    link[[p, d.fab.peer[p]]] = 1
    out = []
    for n in (2, 0, 1, 0, 2):
        out += _polls_and_cycles(d, 1, 5, inc={"port_link_down_events_total": link * n})
    f = firing(out, "flap_storm")
    assert f and f[0].at_ms == d.t + 1000  # fired on the poll that brought the fifth flap, within 20 min
    d2 = Driver(step_ms=300_000)
    _polls_and_cycles(d2, 4, 5)
    out = []
    for n in (1, 0, 1, 0, 0, 1, 0, 1, 0):
        out += _polls_and_cycles(d2, 1, 5, inc={"port_link_down_events_total": link * n})
    assert firing(out) == []


def test_on_change_oper_transitions_between_polls_are_flaps() -> None:
    """A host reporting oper status ON_CHANGE (no link-down or carrier counter): five down/up transitions
    between two 60 s polls are a storm; one is not."""
    fab = tiny_fabric()
    st = FeatureState(fab)
    eng = Engine()
    P = fab.P
    p = next(i for i in range(P) if fab.port_label(i) == "h2:eth1")
    t = T0
    up = np.ones(P)
    for _ in range(5):  # polls of oper status only
        t += 60_000
        st.observe({"port_oper_up": (np.arange(P), np.full(P, t), up)})
        assert eng.run_cycle(st, t + 1000) == []
    events = []
    for k in range(5):  # ON_CHANGE: down at +5 s, up at +8 s, five times
        events += [(t + 10_000 * k + 5_000, 0.0), (t + 10_000 * k + 8_000, 1.0)]
    st.observe({"port_oper_up": (np.full(len(events), p), np.array([e[0] for e in events]),
                                 np.array([e[1] for e in events]))})
    f = firing(eng.run_cycle(st, t + 60_000), "flap_storm")
    assert [(x.device, x.port) for x in f] == [("h2", "eth1")]
    assert st.degraded_rules(p)["flap_storm"] == [
        "no link-down counter: flaps from carrier changes or oper-status transitions"]
    assert st.blocked_rules(p)["post_fec_errors"].startswith("no post-FEC counter")


def test_a_metric_that_stops_reporting_ages_out() -> None:
    """Optics stop (the DOM poller died) while a lane is degraded: the finding holds as it was (no new data is
    not 'cleared'), then ends once its observations are older than the persistence window (2 h)."""
    d = Driver()
    d.run(30)
    p = d.port("leaf", "Ethernet1/5")
    rx = d.rx.copy()
    rx[d.fab.lane_off[p] + 2] -= 3.5
    assert firing(d.run(5, rx=rx), "optical_degradation")
    silent = []
    for _ in range(150):  # 2.5 h without any optics reading
        d.step(drop={"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes"})
        silent.append(d.cycle())
    opt = [i for i, fs in enumerate(silent) if any(f.kind == "optical_degradation" for f in fs)]
    assert opt[0] == 0 and 110 <= opt[-1] < 125, (opt[0], opt[-1])  # held, then gone at ~2 h


def test_pause_duty_per_sub_window_sees_a_short_storm_in_a_long_cycle() -> None:
    """Counters every 10 s, one cycle every 15 min: a NIC that paused 100 % for 3 minutes of the 15 is a pause
    storm (its worst 60 s sub-windows), not 20 % duty averaged over the cycle."""
    d = Driver(step_ms=10_000)
    p = d.port("h2", "eth0")
    out = []
    for k in range(180):  # 30 min
        storm = 60 <= k % 90 < 78  # 3 min of each 15
        pause, rx_back = np.zeros(d.fab.P), np.zeros(d.fab.P)
        if storm:
            pause[p] = 10.0
            rx_back[p] = -400e9 * 10 / 8 * 0.3 * 0.999
        d.step(inc={"port_rx_bytes_total": rx_back}, prio_inc={"port_pfc_tx_pause_seconds_total": pause})
        if (k + 1) % 90 == 0:
            out += d.cycle()
    f = firing(out, "pause_storm")
    assert f and {(x.device, x.port) for x in f} == {("h2", "eth0")}


def test_a_cycle_longer_than_the_poll_counts_each_poll() -> None:
    """Counters and PCIe gauges every 5 min, one cycle every 15 min: a level held in 3 polls is 3 observations,
    so the PCIe downgrade (3 of 5) and a post-FEC trickle in every poll (2 of 3) fire on the first cycle after
    they began, as at 5 min cycles; a post-FEC error in one poll of the three does not (1 of 3)."""
    d = Driver(step_ms=300_000)
    for _ in range(4):
        for _ in range(3):
            d.step()
        d.cycle()
    q, p, r = d.port("h3", "eth1"), d.port("h1", "eth2"), d.port("h2", "eth3")
    d.pcie[q] = 8
    err = np.zeros(d.fab.P)
    err[p] = 5
    for k in range(3):
        e = err.copy()
        e[r] = 5 if k == 1 else 0
        d.step(inc={"port_fec_uncorrectable_codewords_total": e})
    out = d.cycle()
    fired = {(f.kind, f.device, f.port) for f in firing(out)}
    assert fired == {("host_side", "h3", "eth1"), ("post_fec_errors", "h1", "eth2")}


def test_post_fec_before_the_optics_are_read_keeps_its_alert_and_takes_the_optical_cause() -> None:
    """A 5 dB dirty connector loses frames at once; counters every 5 min see it before the 15 min DOM poll does.
    The post-FEC alert pages first; when the rx reading comes, the same alert (same fingerprint) names the cause
    (contamination, clean the connectors) instead of a second, optical alert opening beside it."""
    from tests.detection.simfeed import T0 as T0_S
    from tests.detection.simfeed import Recording

    spec = {"seed": 7, "topology": {"shape": "two-tier", "hosts": 8, "pods": 2, "nics_per_host": 4,
                                    "gpus_per_host": 4, "hosts_per_leaf": 16, "spines": 2,
                                    "optics_mix": {"400G-DR4": 1.0}},
            "faults": [{"type": "dirty_connector", "device": "leaf-p1-01", "port": "Ethernet1/2", "lanes": [1],
                        "drop_db": 5.0, "at": "50m"}]}
    out = Recording(spec, 100 * 60, step=60).replay(300, 900, 60)
    alarms = [f for f in out if f.severity.value != "info"]
    assert {f.fingerprint for f in alarms} == {"post_fec_errors/leaf-p1-01:Ethernet1/2"}
    first, last = alarms[0], alarms[-1]
    assert first.cause.value == "post_fec_errors" and first.at_ms < (T0_S + 60 * 60) * 1000
    assert last.cause.value == "connector_contamination" and last.action.value == "clean_connectors"
