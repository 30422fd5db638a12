"""Each layer-0/1/3 rule on small crafted series, and the guard rails (no database)."""

from __future__ import annotations

import numpy as np
import pytest

from service.detection.findings import Action, Cause, Severity
from service.detection.state import Config, FeatureState, increases
from service.telemetry.counters import increase
from tests.detection.crafted import T0, Driver, firing, tiny_fabric


def warm(d: Driver, n: int = 20) -> list:
    return d.run(n)


def link_lanes(d: Driver, dev: str, port: str) -> tuple[int, np.ndarray, np.ndarray]:
    """The far end of dev:port, and the lane indices of both ends."""
    p = d.port(dev, port)
    q = int(d.fab.peer[p])
    return q, np.arange(d.fab.lane_off[p], d.fab.lane_off[p + 1]), np.arange(d.fab.lane_off[q], d.fab.lane_off[q + 1])


def test_healthy_fabric_raises_nothing() -> None:
    d = Driver()
    assert d.run(60) == []


def test_post_fec_errors_fire_after_two_intervals() -> None:
    d = Driver()
    warm(d)
    p = d.port("h1", "eth2")
    extra = np.zeros(d.fab.P)
    extra[p] = 40
    out1 = d.run(1, inc={"port_fec_uncorrectable_codewords_total": extra})
    assert firing(out1) == []  # one interval is not yet two
    out = d.run(2, inc={"port_fec_uncorrectable_codewords_total": extra})
    f = firing(out, "post_fec_errors")
    assert {(x.device, x.port) for x in f} == {("h1", "eth2")}
    assert f[0].severity is Severity.PAGE and f[0].cause is Cause.POST_FEC and f[0].physical


def test_post_fec_burst_fires_on_its_first_interval_unless_the_link_flapped() -> None:
    d = Driver()
    warm(d)
    p = d.port("h1", "eth2")
    burst = np.zeros(d.fab.P)
    burst[p] = d.st.cfg.post_fec_burst * 3
    f = firing(d.run(1, inc={"port_fec_uncorrectable_codewords_total": burst}), "post_fec_errors")
    assert [(x.device, x.port, x.cause) for x in f] == [("h1", "eth2", Cause.POST_FEC)]
    q = d.port("h2", "eth1")
    burst = np.zeros(d.fab.P)
    burst[q] = d.st.cfg.post_fec_burst * 3
    flap = np.zeros(d.fab.P)
    flap[[q, d.fab.peer[q]]] = 1
    out = d.run(1, inc={"port_fec_uncorrectable_codewords_total": burst, "port_link_down_events_total": flap})
    assert not [x for x in firing(out, "post_fec_errors") if x.port == "eth1"]  # errors across a flap: wait


def test_post_fec_on_degraded_optics_names_the_optical_cause() -> None:
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/7")
    rx = d.rx.copy()
    rx[d.fab.lane_off[p] + 1] -= 4.0
    burst = np.zeros(d.fab.P)
    burst[p] = d.st.cfg.post_fec_burst * 3
    out = d.run(1, rx=rx, inc={"port_fec_uncorrectable_codewords_total": burst})
    f = [x for x in firing(out) if x.port == "Ethernet1/7"]
    assert [(x.kind, x.cause, x.severity) for x in f] == [
        ("optical_degradation", Cause.CONTAMINATION, Severity.PAGE)]


def test_flap_storm_is_five_flaps_within_30_min_however_the_polls_split_them() -> None:
    d = Driver()
    warm(d, 10)
    p = d.port("leaf", "Ethernet1/3")
    link = np.zeros(d.fab.P)
    link[[p, d.fab.peer[p]]] = 1
    out = d.run(1, inc={"port_link_down_events_total": link * 4}) + d.run(5)
    assert firing(out) == []  # four flaps in a minute: bad, but not a storm
    f = firing(d.run(1, inc={"port_link_down_events_total": link}), "flap_storm")  # a fifth, 6 min later
    assert len(f) == 1 and {f[0].device, f[0].peer_device} == {"leaf", "h0"}
    assert "5 flaps within the last 30 min" in f[0].summary
    ev = {e.feature: e.value for e in f[0].evidence}
    assert ev["flaps_in_window"] == 5 and ev["onset_ms"] == d.t - 6 * 60_000  # the storm's first counted flap
    # the same link 31 min after its last flap: the window has emptied, one more flap is not a storm
    quiet = d.run(31)
    assert firing(quiet, "flap_storm") and not [x for x in quiet if x.at_ms >= d.t - 2 * 60_000]
    assert not firing(d.run(1, inc={"port_link_down_events_total": link}), "flap_storm")


def test_loose_module_burst_opens_one_finding_that_holds_across_bursts() -> None:
    d = Driver()
    warm(d, 30)
    p = d.port("h3", "eth1")
    rec = np.zeros(d.fab.P)
    rec[p] = 3
    ber = np.zeros(d.fab.P)
    ber[p] = 400e9 * 60 * 1e-8 * 300  # pre-FEC BER up 2.5 decades in that poll
    burst = {"port_link_error_recovery_total": rec, "port_fec_corrected_bits_total": ber}
    f = firing(d.run(1, inc=burst), "loose_module")
    assert [(x.device, x.port, x.cause, x.action) for x in f] == [
        ("h3", "eth1", Cause.LOOSE_MODULE, Action.RESEAT)]
    quiet = d.run(15)
    assert {x.fingerprint for x in firing(quiet)} == {f[0].fingerprint}  # held, not re-opened
    again = d.run(1, inc=burst)
    assert {x.fingerprint for x in firing(again)} == {f[0].fingerprint}
    assert len(firing(d.run(1), "loose_module")) == 1
    # the penalty decays (half-life 1 h): the finding ends on its own
    assert firing(d.run(200), "loose_module")[-1].at_ms < d.t
    one = np.zeros(d.fab.P)
    one[d.port("h0", "eth0")] = 1  # a single link recovery on a healthy link: nothing
    assert firing(d.run(1, inc={"port_link_error_recovery_total": one})) == []


def test_flap_storm_versus_isolated_flaps() -> None:
    d = Driver(step_ms=10_000)
    warm(d, 10)
    p = d.port("leaf", "Ethernet1/3")
    one = np.zeros(d.fab.P)
    one[[p, d.fab.peer[p]]] = 1
    out = []
    for _ in range(3):  # three isolated single flaps, a minute apart: no alert
        out += d.run(1, inc={"port_link_down_events_total": one})
        out += d.run(6)
    assert firing(out) == []
    storm = one * 6
    out = d.run(2, inc={"port_link_down_events_total": storm})
    f = firing(out, "flap_storm")
    assert len({x.fingerprint for x in f}) == 1  # one finding per link, not one per end
    assert f[0].action is Action.DISABLE_PORT and f[0].scope == "link"
    assert {f[0].device, f[0].peer_device} == {"leaf", "h0"}


def test_nic_pause_storm_is_not_congestion() -> None:
    d = Driver()
    warm(d)
    p = d.port("h2", "eth0")
    pause = np.zeros(d.fab.P)
    pause[p] = 60.0  # paused the whole 60 s interval
    stall = np.zeros(d.fab.P)
    stall[p] = 10
    rx_back = np.zeros(d.fab.P)
    rx_back[p] = -400e9 * 60 / 8 * 0.3 * 0.999  # draining ~nothing
    out = d.run(2, inc={"port_pause_storm_error_events_total": stall, "port_rx_bytes_total": rx_back},
                prio_inc={"port_pfc_tx_pause_seconds_total": pause})
    f = firing(out, "pause_storm")
    assert [(x.device, x.port) for x in f][:1] == [("h2", "eth0")]
    assert f[0].cause is Cause.NIC_PAUSE_STORM and f[0].action is Action.DRAIN_HOST and not f[0].physical
    assert not [x for x in out if x.physical]


def test_congestion_alone_raises_no_physical_finding() -> None:
    d = Driver()
    warm(d)
    ecn = np.zeros(d.fab.P)
    ecn[: d.fab.P // 2] = 400e9 * 60 / 8 * 0.3 / 4096 * 0.1  # 10 % of rx packets ECN-marked
    pause = np.zeros(d.fab.P)
    pause[: d.fab.P // 2] = 60 * 0.1
    out = d.run(10, inc={"port_ecn_marked_packets_total": ecn}, prio_inc={"port_pfc_tx_pause_seconds_total": pause})
    assert firing(out, "congestion")
    assert all(f.cause is Cause.CONGESTION and not f.physical for f in out)


def test_host_side_pcie_downgrade() -> None:
    d = Driver()
    warm(d)
    d.pcie[d.port("h3", "eth1")] = 8
    out = d.run(5)
    f = firing(out, "host_side")
    assert [(x.device, x.port) for x in f][:1] == [("h3", "eth1")] and f[0].cause is Cause.HOST_SIDE


def test_contamination_step_on_one_lane_local_end() -> None:
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/5")
    lane = d.fab.lane_off[p] + 2
    rx = d.rx.copy()
    rx[lane] -= 3.5
    out = d.run(5, rx=rx)
    f = firing(out, "optical_degradation")
    assert f and {(x.device, x.port, x.cause, x.end, x.action) for x in f} == {
        ("leaf", "Ethernet1/5", Cause.CONTAMINATION, "local", Action.CLEAN)}
    assert "lane 2" in f[-1].summary
    assert any(e.feature == "rx_delta_baseline_db" and e.value < -3 for e in f[-1].evidence)


def test_peer_transmitter_fault_points_at_the_peer() -> None:
    d = Driver()
    warm(d, 30)
    q, lanes_p, lanes_q = link_lanes(d, "leaf", "Ethernet1/6")
    d.tx[lanes_q] -= 2.5
    rx = d.rx.copy()
    rx[lanes_p] -= 2.5
    out = d.run(5, rx=rx)
    f = firing(out, "optical_degradation")
    assert f and f[-1].cause is Cause.TX_WEAROUT and f[-1].end == "peer"
    assert (f[-1].device, f[-1].port) == (d.fab.dev_names[d.fab.dev[q]], d.fab.port_names[q])
    assert f[-1].action is Action.REPLACE_PEER and (f[-1].peer_device, f[-1].peer_port) == ("leaf", "Ethernet1/6")


def test_admin_down_port_raises_no_optical_alert() -> None:
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/7")
    q = int(d.fab.peer[p])
    rx = d.rx.copy()
    for x in (p, q):
        rx[d.fab.lane_off[x]:d.fab.lane_off[x + 1]] = -40.0
    d.admin[p] = 0
    d.oper[[p, q]] = 0
    assert d.run(10, rx=rx) == []


def test_counter_reset_wrap_and_missing_data_raise_nothing() -> None:
    d = Driver()
    warm(d)
    for m in d.counters:  # a reboot: every counter restarts from zero
        d.counters[m][:] = 0
    assert d.run(5) == []
    # 32-bit counters that wrap: declared width makes the drop a wrap, not a reset (a reset here
    # would make the ECN share of rx packets jump and read as congestion)
    d2 = Driver()
    wrapping = ("port_rx_packets_total", "port_ecn_marked_packets_total")
    for m in wrapping:
        d2.st.set_counter_meta(m, np.arange(d2.fab.P), np.full(d2.fab.P, 32), np.zeros(d2.fab.P, bool))
        d2.counters[m] = np.full(d2.fab.P, 2.0**32 - 2e6)
    out = []
    for _ in range(20):
        d2.step()
        for m in wrapping:
            d2.counters[m] = d2.counters[m] % 2**32
        out += d2.cycle()
    assert out == []
    # missing data: whole metrics absent for a while, then back
    out = []
    for _ in range(8):
        d.step(drop={"optic_rx_power_dbm", "port_rx_phy_bits_total", "port_fec_corrected_bits_total"})
        out += d.cycle()
    out += d.run(5)
    assert out == []


def test_saturated_counter_gives_unknown_not_an_alert() -> None:
    d = Driver()
    warm(d)
    m = "port_symbol_errors_total"
    d.st.set_counter_meta(m, np.arange(d.fab.P), np.full(d.fab.P, 16), np.ones(d.fab.P, bool))
    d.counters[m][:] = 2**16 - 1  # stuck at max from the start: the increase is unknown
    d.run(1)
    assert d.run(5) == []


def test_shared_component_is_one_device_finding() -> None:
    d = Driver()
    warm(d)
    leaf = np.flatnonzero(d.fab.dev == d.fab.dev_names.index("leaf"))
    bad = leaf[: int(len(leaf) * 0.5)]
    corr = np.zeros(d.fab.P)
    corr[bad] = 400e9 * 60 * 1e-5  # pre-FEC BER 1e-5: 3 decades over baseline
    out = d.run(6, inc={"port_fec_corrected_bits_total": corr})
    dev = firing(out, "shared_component")
    assert dev and dev[-1].device == "leaf" and dev[-1].scope == "device" and dev[-1].port is None
    assert sorted(dev[-1].members) == sorted(d.fab.port_names[p] for p in bad)
    assert not [f for f in out if f.kind != "shared_component" and f.device == "leaf"]


def test_hosts_cabled_to_a_failing_line_card_are_not_shared_components() -> None:
    d = Driver()
    warm(d)
    leaf = np.flatnonzero(d.fab.dev == d.fab.dev_names.index("leaf"))
    bad = leaf[: int(len(leaf) * 0.5)]  # the line card: h0's and h1's four links each
    corr = np.zeros(d.fab.P)
    corr[bad] = 400e9 * 60 * 1e-5
    flaps = np.zeros(d.fab.P)
    flaps[bad[:6]] = 1  # six line-card links flap in two polls, all four of h0's: both ends count it
    flaps[d.fab.peer[bad[:6]]] = 1
    out = d.run(3, inc={"port_fec_corrected_bits_total": corr})
    out += d.run(2, inc={"port_fec_corrected_bits_total": corr, "port_link_down_events_total": flaps})
    out += d.run(3, inc={"port_fec_corrected_bits_total": corr})
    assert {f.device for f in firing(out, "shared_component")} == {"leaf"}


def test_rx_trend_gives_time_to_threshold() -> None:
    cfg = Config()
    d = Driver(step_ms=3_600_000, config=cfg)
    out = d.run(30)  # 30 h healthy: baseline and a full day of buckets
    assert out == []
    p = d.port("leaf", "Ethernet1/9")
    lane = d.fab.lane_off[p] + 3
    rx = d.rx.copy()
    found = []
    start = d.t
    for h in range(72):
        rx[lane] = d.rx[lane] - 0.75 * (h + 1) / 24  # 0.75 dB/day decline
        found += d.run(1, rx=rx)
    f = [x for x in firing(found, "optical_degradation") if x.ttt_hours is not None]
    assert f, "the decline should be reported with a time to threshold"
    first = f[0]
    assert (first.device, first.port) == ("leaf", "Ethernet1/9")
    assert "lane 3" in first.summary and "reaches low-warning in about" in first.summary
    # the true remaining time: the lane's level at that moment down to low-warning (-4.9) at 0.75 dB/day
    def err(x: object) -> float:
        hours = (x.at_ms - start) / 3_600_000
        true_h = (d.rx[lane] - 0.75 * hours / 24 + 4.9) / 0.75 * 24
        return abs(x.ttt_hours - true_h) / true_h

    # first report: the slope window still holds some flat history, so it errs late, within 50 %;
    # once the window is all decline (36 h), within the 25 % MAPE target of detection.md 4.4
    assert err(first) < 0.5
    settled = [x for x in f if x.at_ms - start >= 40 * 3_600_000]
    assert settled and max(err(x) for x in settled) < 0.25


def test_bias_rise_at_constant_tx_is_local_wearout() -> None:
    d = Driver(step_ms=3_600_000)
    d.run(30)
    p = d.port("h0", "eth3")
    lanes = np.arange(d.fab.lane_off[p], d.fab.lane_off[p + 1])
    base = d.bias.copy()
    found = []
    for h in range(96):
        d.bias[lanes] = base[lanes] * (1 + 0.05 * (h + 1) / 24)
        found += d.run(1)
    f = firing(found, "bias_drift")
    assert f and (f[0].device, f[0].port) == ("h0", "eth3") and f[0].cause is Cause.TX_WEAROUT
    assert f[0].action is Action.REPLACE_LOCAL


def test_garbage_never_crashes() -> None:
    d = Driver()
    warm(d, 5)
    P, L = d.fab.P, d.fab.L
    garbage = np.array([np.nan, np.inf, -np.inf, 1e308, -1e308, 0.0])
    for k in range(6):
        v_p, v_l = np.full(P, garbage[k]), np.full(L, garbage[k])
        batch = {m: (np.arange(P), np.full(P, d.t + 1000 * (k + 1)), v_p) for m in d.counters}
        batch["optic_rx_power_dbm"] = (np.arange(L), np.full(L, d.t + 1000 * (k + 1)), v_l)
        batch["port_oper_up"] = (np.arange(P), np.full(P, d.t + 1000 * (k + 1)), v_p)
        batch["not_a_metric"] = (np.arange(3), np.zeros(3), np.zeros(3))
        batch["optic_tx_power_dbm"] = (np.array([-1, 10**9 % L]), np.zeros(2), np.ones(2))
        d.st.observe(batch)
        d.t += 60_000
        for f in d.cycle():
            assert f.summary and np.isfinite(f.score)
    # an empty fabric and a fabric whose cohorts have no members
    empty = tiny_fabric(hosts=0)
    st = FeatureState(empty)
    st.observe({})
    assert Driver(empty).cycle() == []
    fab = tiny_fabric(hosts=1, nics=1)
    fab.cohort_names = fab.cohort_names + ["nobody|1G|core"]
    assert Driver(fab).run(3) == []


@pytest.mark.parametrize("bits,sat", [(None, False), (32, False), (16, True), (8, False)])
def test_vectorised_increases_match_counters_increase(bits: int | None, sat: bool) -> None:
    rng = np.random.default_rng(bits or 1)
    top = 2.0 ** (bits or 40)
    prev = np.floor(rng.uniform(0, top, 2000))
    cur = np.where(rng.random(2000) < 0.5, prev + np.floor(rng.uniform(0, top / 4, 2000)),
                   np.floor(rng.uniform(0, top, 2000)))
    if bits:
        cur = np.where(sat, np.minimum(cur, top - 1), cur % top)
        cur[::7] = top - 1
    prev[::11] = np.nan
    got = increases(prev, cur, np.full(2000, bits or 0, np.int16), np.full(2000, sat))
    want = [increase(float(a), float(b), bits=bits, saturating=sat) for a, b in zip(prev, cur, strict=True)]
    want_a = np.asarray([np.nan if w is None else w for w in want])
    assert np.array_equal(np.isnan(got), np.isnan(want_a))
    assert np.allclose(got[~np.isnan(got)], want_a[~np.isnan(want_a)])


def test_observe_is_independent_of_batching() -> None:
    """Two samples of one entity in a batch, or one per batch: the same state; duplicates and late samples
    that a newer one already overtook change nothing."""
    fab = tiny_fabric(hosts=1, nics=1)
    a, b = FeatureState(fab), FeatureState(fab)
    m = "port_link_down_events_total"
    idx, ts, val = np.array([0, 0, 0]), np.array([1000, 2000, 3000]), np.array([5.0, 7.0, 2.0])
    a.observe({m: (idx, ts, val)})
    for i in range(3):
        b.observe({m: (idx[i:i + 1], ts[i:i + 1], val[i:i + 1])})
    b.observe({m: (idx[1:2], ts[1:2], val[1:2])})  # the same sample again (a retried push)
    b.observe({m: (idx[:1], np.array([2500]), np.array([6.0]))})  # late: older than the newest reading
    for f in ("last", "acc", "acc_ms", "last_ts"):
        assert np.array_equal(getattr(a.counters[m], f), getattr(b.counters[m], f), equal_nan=True)
    assert np.array_equal(a.flaps.t, b.flaps.t)
    assert a.counters[m].acc[0] == 2 + 2  # +2, then a reset counted from zero (+2)


def test_slow_peer_tx_decline_stays_a_transmitter_fault_while_the_alert_is_open() -> None:
    d = Driver()
    warm(d, 30)
    q, lanes_p, lanes_q = link_lanes(d, "leaf", "Ethernet1/8")
    rx = d.rx.copy()
    out = []
    for _ in range(60):  # the far laser fades 3 dB; the receiver sees the same loss
        d.tx[lanes_q] -= 0.05
        rx[lanes_p] -= 0.05
        out += d.run(1, rx=rx)
    out += d.run(400, rx=rx)  # then stays down for hours while the alert is open
    f = [x for x in firing(out, "optical_degradation") if x.peer_port == "Ethernet1/8" or x.port == "Ethernet1/8"]
    assert f and {x.cause for x in f[-50:]} == {Cause.TX_WEAROUT}
    assert (f[-1].device, f[-1].port, f[-1].end) == (d.fab.dev_names[d.fab.dev[q]], d.fab.port_names[q], "peer")


def test_a_down_link_is_one_link_down_finding_with_its_down_time_and_peer() -> None:
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/6")
    q = int(d.fab.peer[p])
    rx = d.rx.copy()
    for x in (p, q):  # no light either way, as on a real down link
        rx[d.fab.lane_off[x]:d.fab.lane_off[x + 1]] = -40.0
    d.oper[[p, q]] = 0
    first_down = d.t + d.step_ms
    out = d.run(8, rx=rx)
    d.st = FeatureState.from_bytes(d.st.to_bytes(), d.fab)  # a live restart keeps the down time
    out += d.run(7, rx=rx)
    fired = firing(out)
    assert {x.kind for x in fired} == {"link_down"}, [(x.kind, x.action) for x in fired]  # no "clean connectors"
    assert len({x.fingerprint for x in fired}) == 1  # one finding per link, not one per end
    f = fired[-1]
    assert (f.cause, f.severity, f.action, f.scope) == (Cause.LINK_DOWN, Severity.PAGE, Action.CHECK_LINK, "link")
    assert {(f.device, f.port), (f.peer_device, f.peer_port)} == {("leaf", "Ethernet1/6"),
                                                                   (d.fab.dev_names[d.fab.dev[q]], d.fab.port_names[q])}
    assert fired[0].at_ms - first_down == d.st.cfg.link_down_hold_ms  # after the hold, not on one down poll
    ev = {e.feature: e.value for e in f.evidence}
    assert ev["down_since_ms"] == first_down and ev["down_for_s"] == 14 * 60
    assert "oper-down since 2025-01-01 00:31:00Z (14 min)" in f.summary and "lost this rail path" in f.summary
    assert f.score > fired[0].score  # longer down is worse
    d.oper[[p, q]] = 1
    assert firing(d.run(3)) == []  # back up: the finding ends (alerting resolves it)


def test_link_down_needs_both_ends_admin_up_and_a_run_of_down_readings() -> None:
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/2")
    q = int(d.fab.peer[p])
    d.oper[[p, q]] = 0
    d.run(1)
    d.oper[[p, q]] = 1
    assert d.run(5) == []  # one down poll (a flap) is not a down link
    d.admin[q] = 0  # the far end shut on purpose: both ends read oper-down, nothing is raised
    d.oper[[p, q]] = 0
    assert d.run(10) == []
    d.admin[q] = 1  # enabled again, but the link does not come up: down since it was enabled, not before
    enabled = d.t + d.step_ms
    f = firing(d.run(4), "link_down")
    # within a poll: a batch may carry the oper reading before the admin reading of the same poll
    assert f and 0 <= {e.feature: e.value for e in f[-1].evidence}["down_since_ms"] - enabled <= d.step_ms


def test_a_line_card_taking_many_links_down_is_one_device_finding() -> None:
    d = Driver()
    warm(d, 30)
    leaf = np.flatnonzero(d.fab.dev == d.fab.dev_names.index("leaf"))
    bad = leaf[:8]
    d.oper[bad] = 0
    d.oper[d.fab.peer[bad]] = 0
    out = d.run(10)
    assert {(f.kind, f.device) for f in firing(out)} == {("shared_component", "leaf")}
    assert sorted(firing(out)[-1].members) == sorted(d.fab.port_names[p] for p in bad)


def test_a_switch_to_switch_link_down_is_a_ticket() -> None:
    fab = tiny_fabric()
    fab.is_host[:] = False  # the same cabling read as leaf-spine links: the traffic takes the other links
    d = Driver(fab)
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/4")
    d.oper[[p, d.fab.peer[p]]] = 0
    f = firing(d.run(4), "link_down")
    assert f and f[-1].severity is Severity.TICKET and "traffic is on the device's other links" in f[-1].summary


@pytest.mark.parametrize("cycle_every", [1, 15])
def test_a_storm_that_ends_with_the_link_down_is_the_storm_at_any_cycle_step(cycle_every: int) -> None:
    """A flap storm whose link then stays down: the storm is the finding, whether the cycles read every poll or
    read the storm and the down run at once (a 15-minute cycle), and it stays the one finding (one alert, one
    page) while the link stays down, after the storm's flaps have left the window too; when the link comes back
    up it ends."""
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/5")
    q = int(d.fab.peer[p])
    link = np.zeros(d.fab.P)
    link[[p, q]] = 3
    rx = d.rx.copy()
    for x in (p, q):
        rx[d.fab.lane_off[x]:d.fab.lane_off[x + 1]] = -40.0
    out, start = [], d.t
    for k in range(90):
        storming, down = k < 3, 3 <= k < 75
        d.oper[[p, q]] = 0 if down else 1
        d.step(inc={"port_link_down_events_total": link} if storming else None, rx=rx if down else None)
        if (k + 1) % cycle_every == 0:
            out += d.cycle()
    fired = [x for x in out if {x.port, x.peer_port} & {"Ethernet1/5"} and x.physical]
    assert fired and fired[0].kind == "flap_storm" and fired[0].cause is Cause.FLAP_STORM
    assert {(x.kind, x.device, x.port) for x in fired} == {("flap_storm", fired[0].device, fired[0].port)}
    assert any("the link is down since" in x.summary for x in fired)
    last_down = start + 75 * 60_000  # the last down poll (polls every 60 s)
    assert max(x.at_ms for x in fired) >= last_down - cycle_every * 60_000  # on for the whole down run
    assert "link down after a flap storm" in fired[-1].summary  # the flaps have left the 30 min window
    assert max(x.at_ms for x in fired) <= last_down + 60_000  # up again: over


def test_physical_findings_carry_the_host_nics_roce_retransmit_and_timeout_rates() -> None:
    """#18: a dirty connector on a switch port costs the RDMA traffic of the host NIC at the far end: the finding's
    evidence carries that NIC's RoCE retransmit, timeout and ICRC rates (per second over the observation)."""
    d = Driver()
    roce = ("port_nak_sequence_errors_total", "port_duplicate_requests_total", "port_local_ack_timeouts_total",
            "port_icrc_errors_total")
    for m in roce:
        d.counters[m] = np.zeros(d.fab.P)
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/7")
    q = int(d.fab.peer[p])
    rx = d.rx.copy()
    rx[d.fab.lane_off[p] + 1] -= 4.0
    inc = {m: np.zeros(d.fab.P) for m in roce}
    inc["port_nak_sequence_errors_total"][q] = 60 * 30   # 30/s
    inc["port_duplicate_requests_total"][q] = 60 * 10    # 10/s
    inc["port_local_ack_timeouts_total"][q] = 60 * 2     # 2/s
    inc["port_icrc_errors_total"][q] = 60 * 0.5
    f = [x for x in firing(d.run(4, rx=rx, inc=inc)) if x.port == "Ethernet1/7"]
    assert f and f[-1].cause is Cause.CONTAMINATION
    ev = {e.feature: e for e in f[-1].evidence}
    nic = f"{d.fab.dev_names[d.fab.dev[q]]}:{d.fab.port_names[q]} (RoCE transport)"
    assert ev["roce_retransmits_per_s"].value == pytest.approx(40.0)
    assert ev["roce_timeouts_per_s"].value == pytest.approx(2.0)
    assert ev["roce_icrc_errors_per_s"].value == pytest.approx(0.5)
    assert ev["roce_retransmits_per_s"].note == nic
    # a NIC that does not report the RoCE counters: no such rows (never a made-up zero)
    d2 = Driver()
    warm(d2, 30)
    f2 = [x for x in firing(d2.run(4, rx=rx)) if x.port == "Ethernet1/7"]
    assert f2 and not {e.feature for e in f2[-1].evidence} & {"roce_retransmits_per_s", "roce_timeouts_per_s"}


def test_a_link_an_optical_loss_took_down_is_link_down_with_the_optical_cause() -> None:
    """A dirty MPO connector 5 dB down on every lane: the link drops (too little light to hold it) but the light still
    arrives. The link-down finding names the optical cause (clean the connector), not only "check the link"; a dark
    link (no light at either end) stays a plain link-down finding."""
    d = Driver()
    warm(d, 30)
    p = d.port("leaf", "Ethernet1/6")
    q = int(d.fab.peer[p])
    rx = d.rx.copy()
    rx[d.fab.lane_off[q]:d.fab.lane_off[q + 1]] -= 5.0  # the host's receiver: light arrives, 5 dB weaker
    d.oper[[p, q]] = 0
    f = firing(d.run(6, rx=rx), "link_down")
    assert f and len({x.fingerprint for x in f}) == 1
    assert (f[-1].cause, f[-1].action, f[-1].severity, f[-1].scope) == (
        Cause.CONTAMINATION, Action.CLEAN, Severity.PAGE, "link")
    assert "connector contamination" in f[-1].summary and "4 lanes" in f[-1].summary and "oper-down" in f[-1].summary
    ev = {e.feature: e.value for e in f[-1].evidence}
    assert ev["rx_delta_baseline_db"] < -4 and ev["down_for_s"] > 0 and ev["onset_ms"] > 0
    d2 = Driver()
    warm(d2, 30)
    dark = d2.rx.copy()
    for x in (p, q):
        dark[d2.fab.lane_off[x]:d2.fab.lane_off[x + 1]] = -40.0
    d2.oper[[p, q]] = 0
    f2 = firing(d2.run(6, rx=dark), "link_down")
    assert f2 and {x.cause for x in f2} == {Cause.LINK_DOWN}


def test_a_post_fec_alert_before_the_optics_keeps_carrying_the_optical_episode_after_the_errors_stop() -> None:
    """Counters every 5 min, optics every 15, cycles every minute: a dirty connector's post-FEC errors alert before
    the optics are read; the rx reading then names the cause, and that one alert goes on with it, also after the
    errors stop while the rx stays down (never a second, optical alert for the same fault)."""
    d = Driver()
    optics = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
              "optic_voltage_volts"}
    others = set(d.counters) | set(d.prio) | {"port_oper_up", "port_admin_up", "gpu_pcie_link_width"}

    def run(n: int, rx: np.ndarray | None = None, inc: dict | None = None) -> list:
        out = []
        for _ in range(n):
            k = (d.t - T0) // d.step_ms + 1  # the minute this step ends
            drop = (optics if k % 15 else set()) | (others if k % 5 else set())
            d.step(rx=rx, inc=inc if k % 5 == 0 else None, drop=drop)
            out += d.cycle()
        return out

    run(60)  # an hour of healthy polls; the next optics poll is at minute 75
    p = d.port("leaf", "Ethernet1/7")
    rx = d.rx.copy()
    rx[d.fab.lane_off[p] + 1] -= 4.0
    errs = np.zeros(d.fab.P)
    errs[p] = 20
    out = run(30, rx=rx, inc={"port_fec_uncorrectable_codewords_total": errs})  # errors for 30 min
    out += run(60, rx=rx)  # the errors stop; the rx stays down
    mine = [x for x in out if x.port == "Ethernet1/7"]
    assert {x.fingerprint for x in mine} == {"post_fec_errors/leaf:Ethernet1/7"}
    first = [x for x in mine if x.state == "firing"][0]
    assert first.at_ms < T0 + 75 * 60_000  # alerted on the counters, before the optics were read
    after = [x for x in mine if x.at_ms >= T0 + 76 * 60_000]
    assert after and {x.cause for x in after} == {Cause.CONTAMINATION}
    assert after[-1].at_ms == d.t and after[-1].state == "firing"  # still open, an hour after the errors stopped


def test_a_port_shut_during_a_missed_poll_of_its_device_raises_no_link_down() -> None:
    """S12: someone shuts leaf:Ethernet1/6 and the leaf's next poll is lost (5 min polls): the host end reads oper-down
    while the leaf's admin status is still the old "up". The link-down finding waits for the far end's next reading
    (admin-down: nothing to raise); a far end that stays silent for two of its poll gaps is a link down."""
    d = Driver(step_ms=300_000)
    warm(d, 12)
    p = d.port("leaf", "Ethernet1/6")
    q = int(d.fab.peer[p])
    leaf = np.flatnonzero(d.fab.dev == d.fab.dev_names.index("leaf"))
    d.admin[p] = 0
    d.oper[[p, q]] = 0
    out = []
    d.step(silent=leaf)  # the leaf's poll is lost: only the host's oper-down arrives
    for k in range(5):  # cycles every minute between the polls
        out += d.eng.run_cycle(d.st, d.t + k * 60_000)
    out += d.run(6)
    assert firing(out, "link_down") == []
    # the same link down with the leaf gone silent (a dead switch): found once the leaf missed two polls
    d2 = Driver(step_ms=300_000)
    warm(d2, 12)
    d2.oper[[p, q]] = 0
    out2 = []
    for _ in range(4):
        d2.step(silent=leaf)
        out2 += d2.cycle()
    f = firing(out2, "link_down")
    assert f and f[0].at_ms == T0 + 14 * 300_000  # the leaf's last reading was poll 12: two gaps of silence


def test_post_fec_errors_that_stopped_before_the_optics_were_read_are_the_same_alert_as_the_optical_cause() -> None:
    """Counters every minute, optics every 15: a damaged fiber's errors alert at once and stop within minutes; the
    next optics reading shows the rx drop. The optical episode goes on as that post-FEC alert, with the optical
    cause (one alert for the fault, its cause right), not as a second, optical alert."""
    d = Driver()
    optics = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
              "optic_voltage_volts"}

    def run(n: int, rx: np.ndarray | None = None, inc: dict | None = None) -> list:
        out = []
        for _ in range(n):
            k = (d.t - T0) // d.step_ms + 1
            d.step(rx=rx, inc=inc, drop=optics if k % 15 else set())
            out += d.cycle()
        return out

    run(61)  # the next optics poll is at minute 75
    p = d.port("leaf", "Ethernet1/7")
    rx = d.rx.copy()
    rx[d.fab.lane_off[p] + 1] -= 4.0
    burst = np.zeros(d.fab.P)
    burst[p] = d.st.cfg.post_fec_burst * 2
    out = run(2, rx=rx, inc={"port_fec_uncorrectable_codewords_total": burst})  # minutes 62-63: errors
    out += run(60, rx=rx)  # no more errors; the rx stays down
    mine = [x for x in out if x.port == "Ethernet1/7" and x.physical]
    assert {x.fingerprint for x in mine} == {"post_fec_errors/leaf:Ethernet1/7"}
    firing_ = [x for x in mine if x.state == "firing"]
    assert firing_[0].at_ms <= T0 + 63 * 60_000 and firing_[0].cause is Cause.POST_FEC  # before the optics
    assert firing_[-1].at_ms == d.t and firing_[-1].cause is Cause.CONTAMINATION  # the optical episode, firing
