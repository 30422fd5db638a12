"""A damaged fiber whose rx wobbles across loss of signal takes its link up and down (issue #23 items 4, 7): at
10 s counter polls that is a real flap storm in the data, but it is the optical fault's symptom, not a second
fault. It joins the optical episode's alert (the storm as evidence), at neither end a page of its own."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import Engine, text

from service.alerts.service import apply_findings, list_events
from service.detection.findings import Cause, Finding, Severity
from tests.detection.crafted import Driver

OPTICS = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
          "optic_voltage_volts"}
POLLS_PER_CYCLE = 30  # counters every 10 s, optics and a cycle every 300 s (the evaluation cell's 10x300 at 300 s)


def _run(d: Driver, minutes: int, rx: np.ndarray | None = None, flapping: np.ndarray | None = None,
         down_every: int = 3) -> list[list[Finding]]:
    """`minutes` of 10 s polls; per cycle, its findings. `flapping`: the link's two ends, down on every
    `down_every`-th poll (one flap each: oper down on that poll, the link-down counter up by one)."""
    cycles: list[list[Finding]] = []
    for _ in range(minutes * 6 // POLLS_PER_CYCLE):
        for k in range(POLLS_PER_CYCLE):
            inc = None
            d.oper[:] = 1
            if flapping is not None and k % down_every == 1:
                d.oper[flapping] = 0
                inc = {"port_link_down_events_total": np.isin(np.arange(d.fab.P), flapping).astype(float)}
            d.step(inc=inc, rx=rx, drop=set() if k == POLLS_PER_CYCLE - 1 else OPTICS)
        cycles.append(d.cycle())
    return cycles


def _link(out: list[list[Finding]], ends: set[tuple[str, str]]) -> list[list[Finding]]:
    return [[x for x in c if x.physical and x.severity is not Severity.INFO
             and ((x.device, x.port) in ends or (x.peer_device, x.peer_port) in ends)] for c in out]


def test_a_fiber_at_loss_of_signal_flapping_its_link_stays_the_optical_alert() -> None:
    d = Driver(step_ms=10_000)
    _run(d, 120)  # two healthy hours
    p = d.port("leaf", "Ethernet1/4")
    q = int(d.fab.peer[p])
    ends = {("leaf", "Ethernet1/4"), (d.fab.dev_names[d.fab.dev[q]], d.fab.port_names[q])}
    lanes = d.fab.lane_off[p] + np.arange(2)
    rng = np.random.default_rng(3)

    def fiber(extra_db: float) -> np.ndarray:
        rx = d.rx.copy()
        rx[lanes] -= 3.0 + extra_db + rng.uniform(-1.0, 1.0, 2)  # lanes 0-1 down 3 dB, a 1 dB wobble
        return rx

    before = []
    for _ in range(12):  # an hour of the damaged fiber: the optical episode opens
        before += _run(d, 5, rx=fiber(0.0))
    opened = [x for c in _link(before, ends) for x in c]
    assert opened and {x.fingerprint for x in opened} == {"optical_degradation/leaf:Ethernet1/4"}
    # its signal now wobbles across loss of signal: at 10 s polls the link drops twice a minute (a storm in the
    # data), for an hour, eases for 20 min, and storms again for an hour
    during = []
    for phase, flaps in ((12, True), (4, False), (12, True)):
        for _ in range(phase):
            during += _run(d, 5, rx=fiber(6.0 if flaps else 0.0), flapping=np.array([p, q]) if flaps else None)
    seen = _link(during, ends)
    assert {x.fingerprint for c in seen for x in c} == {"optical_degradation/leaf:Ethernet1/4"}  # one alert
    assert all(c for c in seen)  # open in every cycle: never resolved, so never reopened
    assert not [x for c in seen for x in c if x.cause is Cause.FLAP_STORM]
    stormy = [x for c in seen for x in c if any(e.feature == "flaps_in_window" for e in x.evidence)]
    assert stormy and max(e.value for x in stormy for e in x.evidence if e.feature == "flaps_in_window") >= 5
    assert "flap" in stormy[-1].summary


def test_a_storm_alert_stays_on_the_end_that_opened_it_when_the_other_end_counts_more() -> None:
    """Both ends count a link's flaps, each from its own polls: when one end's count passes the other's, or the end
    that opened the alert stops seeing a storm while the far end still does, the alert stays where it opened (one
    fingerprint), as long as the link's storm goes on at either end."""
    d = Driver()
    d.run(30)
    p = d.port("leaf", "Ethernet1/5")
    q = int(d.fab.peer[p])
    both, leaf_only = np.zeros(d.fab.P), np.zeros(d.fab.P)
    both[[p, q]] = 3
    leaf_only[p] = 2
    out = d.run(2, inc={"port_link_down_events_total": both})  # a storm at both ends, the same polls
    out += d.run(40, inc={"port_link_down_events_total": leaf_only})  # the host end's poller misses the flaps
    storms = [x for x in out if x.kind == "flap_storm"]
    assert storms and {x.fingerprint for x in storms} == {storms[0].fingerprint}
    assert storms[-1].at_ms == d.t  # still open: the leaf end still sees the storm


# --- the same fiber at the optics polls a fabric has (#23 items 1, 7) ----------------------------------------------
# Counters every 10 s, optics every 5 or 15 min, cycles every 60 s to 15 min. Before, a port with a down reading in
# its observation was not judged at all, so while the fiber dropped its link the optical condition observed "absent"
# at every optics poll that came with a drop: the episode's held readings aged out (5 observations: 75 min at 15 min
# optics), only a flap storm (5 drops in 30 min) kept the alert, and the episode that began again measured its
# wobble afresh (connector contamination for a poll or three inside the fiber alert). A link that drops less often
# than a storm, once per optics poll, lost its alert altogether until the drops stopped

OPTICS_MS = {30: 300_000, 90: 900_000}  # optics every 30 or 90 polls of 10 s
# (minutes, how the link drops): an hour of the damaged fiber (its alert opens), a 2 h storm (the link down at every
# third 10 s poll: longer than 5 optics observations at 15 min), 30 min of calm, a 90 min storm, 30 min of calm, 2 h
# of the link dropping once every 15 min (2 flaps in 30 min: no storm), an hour of calm to the end of the data
PHASES = ((60, ""), (120, "storm"), (30, ""), (90, "storm"), (30, ""), (120, "sparse"), (60, ""))


class _FiberLink:
    """leaf:Ethernet1/4's link, lanes 0-1 of its receiver behind a damaged fiber (3 dB down, a 1 dB wobble)."""

    def __init__(self, step_ms: int, seed: int) -> None:
        self.d = d = Driver(step_ms=step_ms)
        self.p = d.port("leaf", "Ethernet1/4")
        self.q = int(d.fab.peer[self.p])
        self.lanes = d.fab.lane_off[self.p] + np.arange(2)
        self.rng = np.random.default_rng(seed)

    def poll(self, damaged: bool, lossy: bool, down: bool, drop: set[str]) -> None:
        """One poll: the fiber's light (`lossy`: 6 dB more, across loss of signal), the link down at both ends."""
        d, inc, rx = self.d, None, None
        if damaged:
            rx = d.rx.copy()
            rx[self.lanes] -= 3.0 + (6.0 if lossy else 0.0) + self.rng.uniform(-1.0, 1.0, 2)
        d.oper[:] = 1
        if down:
            d.oper[[self.p, self.q]] = 0
            inc = {"port_link_down_events_total": np.isin(np.arange(d.fab.P), [self.p, self.q]).astype(float)}
        d.step(inc=inc, rx=rx, drop=drop)


def _fiber_event(optics_every: int, cycle_every: int) -> tuple[Driver, list[tuple[int, list[Finding]]], int, int]:
    """Two healthy hours, then a fiber loss on lanes 0-1 of leaf:Ethernet1/4's receiver (3 dB, a 1 dB wobble) that
    wobbles across loss of signal (6 dB more) in the phases above, the link down at both ends at each drop. Returns
    the driver, each cycle's (data time, all its findings) from the fiber's onset, and the link's two ports."""
    link = _FiberLink(10_000, seed=3)
    d, p, q = link.d, link.p, link.q
    k, out = 0, []

    def run(minutes: int, damaged: bool = False, drops: str = "") -> None:
        nonlocal k
        for _ in range(minutes * 6):
            k += 1
            # sparse: 150 s before each 15 min optics poll, inside the cycle that reads it at every cycle step
            down = (drops == "storm" and k % 3 == 1) or (drops == "sparse" and k % 90 == 75)
            link.poll(damaged, bool(drops), down, set() if k % optics_every == 0 else OPTICS)
            if k % cycle_every == 0:
                found = d.cycle()
                if damaged:
                    out.append((d.t, found))

    run(120)
    for minutes, drops in PHASES:
        run(minutes, damaged=True, drops=drops)
    return d, out, p, q


def _on_link(found: list[Finding], d: Driver, p: int) -> list[Finding]:
    q = int(d.fab.peer[p])
    ends = {(d.fab.dev_names[d.fab.dev[x]], d.fab.port_names[x]) for x in (p, q)}
    return [x for x in found if x.physical and x.severity is not Severity.INFO
            and ((x.device, x.port) in ends or (x.peer_device, x.peer_port) in ends)]


def _sharpens_once(causes: list[Cause], optics_every: int, cycle_every: int) -> None:
    """The cause of the alert's cycles: connector contamination at most until the optics have been read once more
    after it opened (a fiber's wobble needs 3 readings after the drop; the alert opens on the third: 2), then fiber
    damage in every cycle to the end, never anything else."""
    assert Cause.FIBER in causes
    first = causes.index(Cause.FIBER)
    assert set(causes[:first]) <= {Cause.CONTAMINATION}
    assert first * cycle_every <= optics_every  # at most one optics poll
    assert set(causes[first:]) == {Cause.FIBER}


@pytest.mark.parametrize(("optics_every", "cycle_every"), [(30, 30), (90, 30), (90, 6), (90, 90)],
                         ids=["optics5m-cycle5m", "optics15m-cycle5m", "optics15m-cycle60s", "optics15m-cycle15m"])
def test_a_flapping_damaged_fiber_is_one_open_fiber_alert_at_5_and_15_min_optics(optics_every: int,
                                                                                 cycle_every: int) -> None:
    d, out, p, _ = _fiber_event(optics_every, cycle_every)
    seen = [_on_link(found, d, p) for _, found in out]
    opened = next(i for i, c in enumerate(seen) if c)
    assert (out[opened][0] - out[0][0]) <= 3 * OPTICS_MS[optics_every] + cycle_every * 10_000  # 3 readings
    after = seen[opened:]
    # one alert, in every cycle from its first to the end of the data: never absent, so never resolved or reopened
    assert all(len(c) == 1 for c in after), [len(c) for c in after]
    assert {c[0].fingerprint for c in after} == {"optical_degradation/leaf:Ethernet1/4"}
    assert not [x for c in after for x in c if x.cause is Cause.FLAP_STORM]
    _sharpens_once([c[0].cause for c in after], optics_every, cycle_every)
    # the storms are that alert's evidence, and it pages while the link drops
    stormy = [c[0] for c in after if any(e.feature == "flaps_in_window" for e in c[0].evidence)]
    assert stormy and all(x.severity is Severity.PAGE for x in stormy)


@pytest.mark.parametrize("optics_every", [30, 90], ids=["optics5m", "optics15m"])
def test_the_alert_store_keeps_one_fiber_alert_open_through_the_storms(db: Engine, optics_every: int) -> None:
    """The same event, each 5 min cycle's findings applied to the alert store as the detector's cycle does: one
    alert for the link, opened once and never resolved or reopened to the end of the data, its cause (as the
    store holds it after each cycle) fiber damage from at most one optics poll after it opened."""
    d, out, p, _ = _fiber_event(optics_every, 30)
    history: list[tuple[str, str]] = []
    for at_ms, found in out:
        with db.begin() as conn:
            apply_findings(conn=conn, findings=found, at_ms=at_ms)
            row = conn.execute(text("SELECT state, cause FROM alerts WHERE fingerprint = :f"),
                               {"f": "optical_degradation/leaf:Ethernet1/4"}).first()
            if row is not None:
                history.append((row.state, row.cause))
    with db.connect() as conn:
        rows = conn.execute(text("SELECT id, fingerprint FROM alerts WHERE device = 'leaf' OR peer_device = 'leaf' "
                                 "OR port = 'Ethernet1/4' OR peer_port = 'Ethernet1/4'")).all()
        assert [r.fingerprint for r in rows] == ["optical_degradation/leaf:Ethernet1/4"]
        events = [e["event"] for e in list_events(conn=conn, alert_id=rows[0].id)]
    assert events.count("opened") == 1 and "resolved" not in events and "reopened" not in events, events
    assert {s for s, _ in history} == {"firing"}
    _sharpens_once([Cause(c) for _, c in history], optics_every, 30)


def test_a_damaged_fiber_whose_state_polls_catch_its_link_down_is_one_fiber_alert() -> None:
    """Optics every 60 s, port state and counters every 5 min (DOM polled more often than the interface table), cycles
    every 60 s: the fiber's link is caught down at every other state poll (one flap each, no storm). Each down
    reading is held for 5 optics polls; before, those were 5 "absent" optical observations, so the episode ended at
    each, a link-down alert opened at the host end, the fiber alert came and went (24 cycles absent) and its cause
    flipped back to connector contamination 14 times. A link down at every reading of its observation makes no optical
    observation: the condition stays as it was, and the down link joins the open episode's alert."""
    state = {"port_oper_up", "port_admin_up", "gpu_pcie_link_width", *Driver.fab_counters()}
    link = _FiberLink(60_000, seed=5)
    d, p = link.d, link.p
    k, out = 0, []
    for minutes, damaged, flapping in ((120, False, False), (60, True, False), (120, True, True), (60, True, False)):
        for _ in range(minutes):
            k += 1
            link.poll(damaged, flapping, flapping and k % 10 == 0, set() if k % 5 == 0 else state)
            found = d.cycle()
            if damaged:
                out.append(_on_link(found, d, p))
    opened = next(i for i, c in enumerate(out) if c)
    after = out[opened:]
    assert all(len(c) == 1 for c in after), [len(c) for c in after]
    assert {c[0].fingerprint for c in after} == {"optical_degradation/leaf:Ethernet1/4"}
    _sharpens_once([c[0].cause for c in after], 1, 1)
    downs = [c[0] for c in after if any(e.feature == "down_for_s" for e in c[0].evidence)]
    assert downs and all(x.severity is Severity.PAGE for x in downs)  # the down link, in the fiber's alert


@pytest.mark.parametrize("cycle_every", [1, 5], ids=["cycle60s", "cycle5m"])
def test_a_link_the_optical_loss_takes_down_for_hours_stays_the_optical_alert(cycle_every: int) -> None:
    """A dirty MPO connector (all 4 lanes 5 dB down, light still arriving) alerts as the optics; then the link goes
    down and stays down for 4 h. A down link makes no optical observation, so the episode's own observations aged
    out after the 2 h persistence window, and the down link, no longer joined to an open episode, opened a second,
    link_down alert for the same fault (the 10x300 gradual cell, seed 1 S1). The episode's alert goes on as long as
    the link it took down stays down."""
    d = Driver(step_ms=60_000)
    p = d.port("leaf", "Ethernet1/4")
    q = int(d.fab.peer[p])
    lanes = d.fab.lane_off[p] + np.arange(4)
    seen = []
    for minute in range(7 * 60):
        rx = d.rx.copy()
        if minute >= 120:
            rx[lanes] -= 5.0
        d.oper[:] = 1
        if minute >= 180:
            d.oper[[p, q]] = 0
        d.step(rx=rx)
        if minute % cycle_every == 0:
            found = _on_link(d.cycle(), d, p)
            if minute >= 120:
                seen.append(found)
    opened = next(i for i, c in enumerate(seen) if c)
    after = seen[opened:]
    assert all(len(c) == 1 for c in after), [len(c) for c in after]
    assert {c[0].fingerprint for c in after} == {"optical_degradation/leaf:Ethernet1/4"}
    assert {c[0].cause for c in after} == {Cause.CONTAMINATION}
    downs = [c[0] for c in after if any(e.feature == "down_for_s" for e in c[0].evidence)]
    assert downs and downs[-1] is after[-1][0]  # the down link is in that alert to the end


def test_a_fiber_whose_post_fec_alert_carries_it_is_never_a_loose_module() -> None:
    """Counters and state every 5 min, optics every 15, cycles every 5 min: a damaged fiber (lanes 0-1 3.7 dB down,
    a 1.3 dB wobble) with uncorrectable errors from the start, so its post-FEC alert opens before the optics are
    read and then carries the optical episode; from 2 h in its link retrains at every poll and drops at every
    fourth. Those recoveries and flaps are the fiber's; held-out seed 7 of the issue's cell (300x900 at 60 s)
    showed a loose-module alert on that port, reopened 6 times, beside the fiber's: the carried episode did not hide
    it (powers normal is the loose module's own premise)."""
    d = Driver(step_ms=300_000)
    p = d.port("leaf", "Ethernet1/4")
    q = int(d.fab.peer[p])
    lanes = d.fab.lane_off[p] + np.arange(2)
    rng = np.random.default_rng(7)
    ends = np.isin(np.arange(d.fab.P), [p, q]).astype(float)
    found: list[Finding] = []
    for k in range(24 * 12):
        rx, inc = None, None
        d.oper[:] = 1
        if k >= 8 * 12:
            rx = d.rx.copy()
            rx[lanes] -= 3.7 + rng.uniform(-1.3, 1.3, 2)
            inc = {"port_fec_uncorrectable_codewords_total": (np.arange(d.fab.P) == p) * 1000.0}  # its receiver
            if k >= 10 * 12:  # the link retrains from 2 h in, as the wobble deepens
                inc["port_link_error_recovery_total"] = ends * 2
                if k % 4 == 0:
                    d.oper[[p, q]] = 0
                    inc["port_link_down_events_total"] = ends
        d.step(inc=inc, rx=rx, drop=set() if k % 3 == 0 else OPTICS)
        if k >= 8 * 12:
            found += _on_link(d.cycle(), d, p)
        else:
            d.cycle()
    assert found and found[-1].cause is Cause.FIBER
    assert not [x for x in found if x.kind == "loose_module"], sorted({x.kind for x in found})


def test_a_fiber_that_takes_its_link_down_before_the_optics_tell_is_one_alert_that_sharpens() -> None:
    """Counters and state every 5 min, optics every 15, cycles every minute: a damaged fiber (lanes 0-1 3.7 dB
    down, a 1.3 dB wobble) takes its link down at once. The first reading of its light is weak but one reading
    shows no wobble, so the link-down alert names a dirty connector; 5 min later the link is back with
    uncorrectable errors at the receiver. Held-out seed 7 of the issue's cell (300x900 at 60 s): those errors
    opened a second, post-FEC alert at the other end, which then carried the optical episode and sharpened to
    the fiber, while the first alert stayed a connector. Now the link-down alert carries them: one alert,
    whose cause becomes the fiber, also when the link goes down again."""
    d = Driver(step_ms=60_000)
    others = set(d.counters) | set(d.prio) | {"port_oper_up", "port_admin_up", "gpu_pcie_link_width"}
    p = d.port("leaf", "Ethernet1/4")
    q = int(d.fab.peer[p])
    lanes = d.fab.lane_off[p] + np.arange(2)
    rng = np.random.default_rng(7)
    found: list[list[Finding]] = []
    for minute in range(1, 6 * 60):
        rx, inc = None, None
        d.oper[:] = 1
        if minute >= 134:  # the fault, a minute before the optics poll at 135
            rx = d.rx.copy()
            rx[lanes] -= 3.7 + rng.uniform(-1.3, 1.3, 2)
            if minute < 140:  # down until the state poll at 140
                d.oper[[p, q]] = 0
            elif 240 <= minute < 255:  # and again at 4 h, the other end reading it first
                d.oper[[p] if minute < 245 else [p, q]] = 0
            else:  # back, with errors at its receiver
                inc = {"port_fec_uncorrectable_codewords_total": (np.arange(d.fab.P) == p) * 1000.0}
        d.step(inc=inc if minute % 5 == 0 else None, rx=rx,
               drop=(OPTICS if minute % 15 else set()) | (others if minute % 5 else set()))
        out = d.cycle()
        if minute >= 134:
            found.append(_on_link(out, d, p))
    seen = [x for c in found for x in c]
    assert seen and seen[0].kind == "link_down" and seen[0].cause is Cause.CONTAMINATION  # one stable reading
    assert {x.fingerprint for x in seen} == {seen[0].fingerprint}, sorted({x.fingerprint for x in seen})
    assert seen[-1].cause is Cause.FIBER and not found[-1][0].summary.count("It took")
