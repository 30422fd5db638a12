"""Layer 0 (and the raw per-cycle conditions of layers 1-2): which ports show which condition now.

Each condition is a boolean array over ports plus a score (larger is worse). Nothing here
decides cause, end or persistence (attribution.py does); this module only answers "does
the signal cross its threshold in the newest observation", with guard rails: admin-down ends,
missing data and unknown counter steps never make a condition true.

It also answers, per rule and port, what the rule could run on (`Conditions.blocked`: a
`state.BLOCKED` code when it cannot run at all; `Conditions.degraded`: `state.DEGRADED` bits when
it runs on less than its full inputs), and which rules saw new data this cycle (`fresh`): a rule
whose inputs brought nothing new keeps its previous result (docs/detection.md, "Observations").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.detection.features import Features, nan_num, seg_reduce
from service.detection.state import AXIS, DARK_METRICS, KINDS, NPRIO, FeatureState

# The metrics each rule reads. A rule is "observed" on a port in a cycle that brought new data of any of
# them (lane and priority metrics count for their port); otherwise its condition stays as it was.
INPUTS: dict[str, tuple[str, ...]] = {
    "optical_degradation": ("optic_rx_power_dbm",),
    "dom_threshold": ("optic_temperature_celsius", "optic_voltage_volts", "optic_tx_bias_amperes",
                      "optic_tx_power_dbm"),
    "bias_drift": ("optic_tx_bias_amperes",),
    "post_fec_errors": ("port_fec_uncorrectable_codewords_total", "port_symbol_errors_total",
                        "port_rx_fcs_errors_total", "port_rx_errors_total"),
    "ber_degradation": ("port_fec_corrected_bits_total", "port_pre_fec_ber", "optic_pre_fec_ber"),
    "pause_storm": ("port_pfc_tx_pause_seconds_total", "port_tx_pause_seconds_total",
                    "port_pause_storm_warning_events_total", "port_pause_storm_error_events_total"),
    "host_side": ("gpu_pcie_link_width", "gpu_pcie_link_generation"),
    "congestion": ("port_ecn_marked_packets_total", "port_pfc_tx_pause_seconds_total",
                   "port_tx_pause_seconds_total"),
    "anomaly": ("optic_rx_power_dbm", "optic_tx_bias_amperes", "port_fec_corrected_bits_total", "port_pre_fec_ber",
                "optic_pre_fec_ber"),
}
# Rules whose condition is a level of per-poll readings: a cycle that brought m polls of their inputs (a cycle
# longer than the poll) is m observations of it, so persistence takes the same data time whatever the cycle
# step. Post-FEC counts the polls with errors among them; BER (a ratio of counters) its rate windows of about
# Config.rate_window_ms (a poll, or shorter polls merged), each held or not on its own rate (`ber_windows`).
PER_POLL = ("optical_degradation", "dom_threshold", "bias_drift", "host_side", "post_fec_errors", "ber_degradation")
# Rules on counter rates that count rate windows as BER does (`rate_windows`): the tx pause duty and the ECN-marked
# packet rate, each window held or not on its own rate (the worst priority's duty; the ECN rate against the share
# of the cycle's rx packet rate), the pause-storm event counters their polls merged the same way. A cycle that
# closed no window of them (shorter than a window) observes nothing: the window counts when it closes.
WINDOWED = ("pause_storm", "congestion")
# Rules evaluated on data-time state every cycle (a flap ring, decayed penalties, a run of down readings):
# their inputs carry their own time, so each cycle is an observation.
TIMED = ("flap_storm", "loose_module", "link_down")
# Rules that judge a port's optics: on a port awaiting its state (`awaiting_state`) they observe nothing
OPTICAL = ("optical_degradation", "dom_threshold", "bias_drift", "anomaly")


@dataclass
class Conditions:
    raw: dict[str, np.ndarray] = field(default_factory=dict)     # kind -> (P,) bool
    now: dict[str, np.ndarray] = field(default_factory=dict)     # kind -> (P,) bool: fire without k of n
    score: dict[str, np.ndarray] = field(default_factory=dict)   # kind -> (P,) float
    blocked: dict[str, np.ndarray] = field(default_factory=dict)   # kind -> (P,) uint8 (state.BLOCKED code)
    degraded: dict[str, np.ndarray] = field(default_factory=dict)  # kind -> (P,) uint16 (state.DEGRADED bits)
    hits: dict[str, np.ndarray] = field(default_factory=dict)    # kind -> (P,) int: held observations (WINDOWED)
    lane_deg: np.ndarray | None = None                           # (L,) bool: degraded optical lanes
    optics_ok: np.ndarray | None = None                          # (P,) bool: in service (optical rules run)
    wait: np.ndarray | None = None                               # (P,) bool: dark optics awaiting port state


def _t(x: np.ndarray) -> np.ndarray:
    """NaN-safe truth: NaN is False (what nan_to_num(x).astype(bool) gives, without its overhead)."""
    if x.dtype == bool:
        return x
    return (x != 0) & ~np.isnan(x) if x.dtype.kind == "f" else x.astype(bool)


def _per_port(st: FeatureState, metric: str, x: np.ndarray) -> np.ndarray:
    """A lane or priority array reduced to its port (any)."""
    axis = AXIS[metric]
    if axis == "lane":
        return seg_reduce(np.maximum, x.astype(float), st.fabric.lane_off, 0.0) > 0
    if axis == "prio":
        return x.reshape(-1, NPRIO).any(axis=1)
    return x


def ber_windows(st: FeatureState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P,) where BER comes from corrected-bit rate windows this cycle (a threshold was set and a window closed),
    how many windows closed, and how many of them reached the BER condition's rate (`set_ber_threshold`)."""
    corr = st.counters["port_fec_corrected_bits_total"]
    use = (corr.o_n > 0) & np.isfinite(corr.thr)
    return use, corr.o_n.astype(np.int64), corr.o_hit.astype(np.int64)


def _pause_port(st: FeatureState, per_prio: np.ndarray, glob: np.ndarray) -> np.ndarray:
    """(P,) a per-priority PFC pause value reduced to its port (the worst priority), else the global pause's."""
    P = st.fabric.P
    pfc = st.counters["port_pfc_tx_pause_seconds_total"].seen().reshape(P, NPRIO).any(axis=1)
    return np.where(pfc, per_prio.reshape(P, NPRIO).max(axis=1), glob)


def rate_windows(st: FeatureState) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(P,) the rate windows (about Config.rate_window_ms of data each) this cycle closed: of tx pause (worst
    priority, else global pause), of ECN-marked packets, and of the pause-storm event counters (their polls merged
    into windows), with how many of the last that brought an event."""
    c, rw = st.counters, max(st.cfg.rate_window_ms, 1)
    pause = _pause_port(st, c["port_pfc_tx_pause_seconds_total"].o_n, c["port_tx_pause_seconds_total"].o_n)
    ev = np.zeros(st.fabric.P, np.int64)
    ev_hit = np.zeros(st.fabric.P, np.int64)
    for m in ("port_pause_storm_warning_events_total", "port_pause_storm_error_events_total"):
        ct = c[m]
        n = np.where(ct.acc_n > 0, np.clip(np.rint(ct.acc_ms / rw), 1, np.maximum(ct.acc_n, 1)), 0).astype(np.int64)
        ev = np.maximum(ev, n)
        ev_hit = np.maximum(ev_hit, np.minimum(ct.acc_nz, n))
    return pause.astype(np.int64), c["port_ecn_marked_packets_total"].o_n.astype(np.int64), ev, ev_hit


def pause_windows_at(st: FeatureState, duty: float) -> np.ndarray:
    """(P,) this cycle's tx pause windows whose duty (pause seconds per second) reached `duty`, worst priority."""
    c = st.counters
    return _pause_port(st, c["port_pfc_tx_pause_seconds_total"].windows_at(duty),
                       c["port_tx_pause_seconds_total"].windows_at(duty))


def set_ber_threshold(st: FeatureState) -> None:
    """The corrected-bit rate (per s) at which a rate window holds the BER condition, for the windows that close
    before the next cycle: BER within `ber_margin_dec` of the FEC limit, or `ber_jump_dec` over its baseline,
    at the rx phy bit rate held now (line rate)."""
    cfg = st.cfg
    with np.errstate(invalid="ignore", over="ignore"):
        ber = np.fmin(st.fabric.fec_limit * 10.0 ** -cfg.ber_margin_dec,
                      10.0 ** (st.base["logber"].loc + cfg.ber_jump_dec))
        line = st.counters["port_rx_phy_bits_total"].rate()
        # no line bits (a port shut or down): no BER to take, as for the cycle's own ratio
        st.counters["port_fec_corrected_bits_total"].thr[:] = np.where(line > 0, ber * line, np.nan)


def fresh_kinds(st: FeatureState) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray],
                                           dict[str, np.ndarray]]:
    """Per rule: (P,) ports whose inputs brought new data this cycle, that data's newest sample time, and how many
    observations it is (PER_POLL rules: the polls, the fewest among its fresh inputs; BER its rate windows;
    others 1); and, per counted rule, how many of those observations held (post-FEC: the polls with errors; BER:
    the windows at the condition's rate, or all of them where BER is a gauge's level)."""
    P = st.fabric.P
    fresh: dict[str, np.ndarray] = {}
    obs_ms: dict[str, np.ndarray] = {}
    polls: dict[str, np.ndarray] = {}
    port_fresh: dict[str, np.ndarray] = {}
    port_ts: dict[str, np.ndarray] = {}
    port_n: dict[str, np.ndarray] = {}
    none, zero = np.zeros(P, bool), np.zeros(P, np.int64)
    for metrics in INPUTS.values():
        for m in metrics:
            if m in port_fresh:
                continue
            fm = st.fresh_m.get(m)
            track = st.gauges.get(m) or st.counters[m]
            if fm is None or len(fm) != len(track.last_ts):
                fm = np.zeros(len(track.last_ts), bool)
            n = st.polls_m.get(m, np.zeros(len(fm), np.int32))
            if len(n) != len(fm):
                n = np.zeros(len(fm), np.int32)
            if not fm.any() and not n.any():  # nothing new (most metrics, most cycles): what the below gives
                port_fresh[m], port_ts[m], port_n[m] = none, zero, zero
                continue
            port_fresh[m] = _per_port(st, m, fm)
            ts = np.where(fm, track.last_ts, 0)
            if AXIS[m] == "lane":
                off = st.fabric.lane_off
                port_ts[m] = seg_reduce(np.maximum, ts.astype(float), off, 0.0).astype(np.int64)
                port_n[m] = seg_reduce(np.maximum, n.astype(float), off, 0.0).astype(np.int64)
            elif AXIS[m] == "prio":
                port_ts[m] = ts.reshape(-1, NPRIO).max(axis=1)
                port_n[m] = n.reshape(-1, NPRIO).max(axis=1)
            else:
                port_ts[m], port_n[m] = ts, n.astype(np.int64)
    for kind, metrics in INPUTS.items():
        fresh[kind] = np.zeros(P, bool)
        obs_ms[kind] = np.zeros(P, np.int64)
        fewest = np.full(P, np.iinfo(np.int64).max)
        for m in metrics:
            if port_fresh[m] is none:  # nothing new: adds nothing to any of the three
                continue
            fresh[kind] |= port_fresh[m]
            obs_ms[kind] = np.maximum(obs_ms[kind], port_ts[m])
            fewest = np.where(port_fresh[m], np.minimum(fewest, port_n[m]), fewest)
        polls[kind] = np.where(fresh[kind], np.maximum(fewest, 1), 0) if kind in PER_POLL else \
            fresh[kind].astype(np.int64)
    nz = np.zeros(P, np.int64)
    for m in INPUTS["post_fec_errors"]:
        nz = np.maximum(nz, st.nz_m.get(m, np.zeros(P, np.int32)))
    use, wins, wins_hit = ber_windows(st)
    fb = fresh["ber_degradation"]
    gauge_polls = np.maximum(port_n["port_pre_fec_ber"], port_n["optic_pre_fec_ber"])
    polls["ber_degradation"] = np.where(fb, np.maximum(np.where(use, wins, gauge_polls), 1), 0)
    hits = {"post_fec_errors": np.minimum(nz, polls["post_fec_errors"]),
            "ber_degradation": np.where(use, wins_hit, polls["ber_degradation"])}
    # pause duty and ECN share: the rate windows closed this cycle (held ones: `evaluate`, Conditions.hits)
    pause_n, ecn_n, ev_n, _ = rate_windows(st)
    for kind, n in (("pause_storm", np.maximum(pause_n, ev_n)), ("congestion", np.maximum(pause_n, ecn_n))):
        fresh[kind], polls[kind] = n > 0, n
    # a link down at every oper reading of its observation, admin-down at neither end, reads no light of optics in
    # service (its dark readings after a down one are not even stored: FeatureState._excused): no optical
    # observation, so the optical condition stays as it was, neither held nor absent (#23 item 1; a flapping link
    # whose oper status is polled less often than its optics holds one down reading for several optics polls). The
    # down link is the link-down finding's. A port shut on purpose (admin-down) observes "absent" as before
    fresh["optical_degradation"] = fresh["optical_degradation"] & ~down_throughout(st)
    return fresh, obs_ms, polls, hits


def either_end(mask: np.ndarray, peer: np.ndarray) -> np.ndarray:
    """Ports where `mask` holds at the port itself or at the far end of its link."""
    return mask | np.where(peer >= 0, mask[np.maximum(peer, 0)], False)


def down_throughout(st: FeatureState) -> np.ndarray:
    """(P,) ports whose newest oper observation is down at every reading, admin-down at neither end."""
    g = st.gauges
    with np.errstate(invalid="ignore"):
        off = either_end(_t(g["port_admin_up"].h_min < 0.5), st.fabric.peer)
        return _t(g["port_oper_up"].h_max < 0.5) & ~off


def polled(st: FeatureState) -> np.ndarray:
    """(P,) ports that brought any new data this cycle (a device observation, for device-level persistence)."""
    out = np.zeros(st.fabric.P, bool)
    for m, fm in st.fresh_m.items():
        if len(fm) and fm.any():
            out |= _per_port(st, m, fm)
    return out


def awaiting_state(st: FeatureState, at_ms: int) -> np.ndarray:
    """(P,) ports whose optics went dark (a lane's rx or tx under `lit_dbm`) after their port state was last read.

    No light is the port state's to explain: a port shut on purpose turns its laser off, and its far end receives
    nothing, while admin and oper status still say up until their next poll, which may come 5-15 optics polls
    later (DOM every minute, state with the counters every 5-15 min). Judged on the held state, the shut module
    is a tx low alarm and the far receiver a dying transmitter. So these ports' optical rules wait for a state
    reading made since the darkness began: at most two of the port's state poll gaps (a missed poll), never more
    than `max_gap_ms`; a port that reports no state has nothing to wait for. A dark lane on a port whose state
    then says up is judged from that reading on."""
    cfg, g = st.cfg, st.gauges
    dark = np.maximum.reduce([st.dark_since[m] for m in DARK_METRICS])
    dark_on = seg_reduce(np.maximum, dark.astype(float), st.fabric.lane_off, 0.0).astype(np.int64)
    state_ts = np.maximum(g["port_oper_up"].last_ts, g["port_admin_up"].last_ts)
    gap = np.where(st.oper_gap > 0, 2 * st.oper_gap, cfg.max_gap_ms)
    limit = np.minimum(gap, cfg.max_gap_ms) + cfg.lateness_ms
    return (dark_on > 0) & (state_ts > 0) & (state_ts < dark_on) & (at_ms - dark_on <= limit)


def evaluate(f: Features, st: FeatureState) -> Conditions:
    fab, cfg = st.fabric, st.cfg
    off, lp = fab.lane_off, fab.lane_port
    P = fab.P
    g, c = st.gauges, st.counters
    out = Conditions()
    blk = {k: np.zeros(P, np.uint8) for k in KINDS}
    deg = {k: np.zeros(P, np.uint16) for k in KINDS}
    out.blocked, out.degraded = blk, deg
    with np.errstate(invalid="ignore"):
        # in service: an admin-down end (here or at the peer) reads 0 mW / -40 dBm by design, and so does a
        # port that was oper-down in the observation: no light is the link-down finding, never an optical one.
        # Without admin status, oper-up means admin up; without either, light on a lane or traffic does.
        # (The optical rule still reads the lit lanes of a link that dropped and came back: `light_read` below)
        admin_known = np.isfinite(f.admin_up)
        oper_known = np.isfinite(f.oper_up)
        traffic = _t(c["port_rx_bytes_total"].rate() > 0)
        admin_off = _t(f.admin_up < 0.5) | _t(f.peer_admin_up < 0.5)
        in_service = ~admin_off & np.where(oper_known, _t(f.oper_up >= 0.5), f.lit | traffic)
        out.wait = awaiting_state(st, f.at_ms)
        in_service &= ~out.wait
        out.optics_ok = in_service
        unknown_state = ~admin_known & ~oper_known & ~(f.lit | traffic)
        state_deg = np.where(admin_known, 0, np.where(oper_known, 1 << 0, 1 << 1)).astype(np.uint16)
        no_th = ~np.isfinite(fab.th["rx_lw"])

        tt = st.lane_trend
        trend_lane = (tt["ttt_warn"] <= cfg.ttt_warn_hours) & (tt["rx_slope"] * 24 <= -cfg.trend_slope_db_per_day)
        lane_deg = (f.rx_delta <= -cfg.rx_drop_db) | (f.rx_margin_warn < 0) | trend_lane
        # a link that dropped and came back within the observation (oper-down and oper-up readings, not admin-down
        # at either end) still has the light its lanes read where every reading of the observation was lit: weak
        # light on a link that keeps dropping is still weak light (a damaged fiber wobbling across loss of signal
        # drops its link at every poll that catches it under; judged out of service, its optical condition faded
        # while it flapped and its alert broke up, #23). A lane with a dark reading in it (a link cut or shut within
        # the observation: its mean mixes light and none) is the down link's, and so is a link down at every
        # reading of the observation (the link-down finding, which names an optical cause where light arrives weak)
        dropped = ~admin_off & ~out.wait & _t(f.oper_up < 0.5) & _t(f.oper_hi >= 0.5)
        light_read = in_service[lp] | (dropped[lp] & _t(f.rx_lo > cfg.lit_dbm))
        lane_deg &= light_read & np.isfinite(f.rx)
        out.lane_deg = lane_deg
        deg_port = seg_reduce(np.maximum, lane_deg.astype(float), off, 0.0) > 0
        # far below the cohort and close to the module's own warning: catches faults older than the baseline
        cohort_low = ((f.rx_margin_cohort_z < -6) & (f.rx_margin_min < 1.5)
                      & (f.rx_margin_cohort_med - f.rx_margin_min >= 3.0) & in_service)
        optical = deg_port | cohort_low
        out.raw["optical_degradation"] = optical
        out.score["optical_degradation"] = np.fmax(-nan_num(f.rx_delta_min, nan=0.0),
                                                   -nan_num(f.rx_margin_min, nan=0.0))
        has_rx = seg_reduce(np.maximum, (g["optic_rx_power_dbm"].last_ts > 0).astype(float), off, 0.0) > 0
        has_bias = seg_reduce(np.maximum, (g["optic_tx_bias_amperes"].last_ts > 0).astype(float), off, 0.0) > 0
        for k in ("optical_degradation", "dom_threshold", "bias_drift", "anomaly"):
            blk[k][unknown_state] = 1
            deg[k] |= np.where(unknown_state, 0, state_deg).astype(np.uint16)
        blk["optical_degradation"][~has_rx] = 2
        deg["optical_degradation"] |= np.where(no_th, 1 << 2, 0).astype(np.uint16)
        blk["bias_drift"][~has_bias] = 3

        th = fab.th
        dom = ((f.temp >= th["temp_ha"]) | (f.volt >= th["volt_ha"]) | (f.volt <= th["volt_la"]))
        dom |= seg_reduce(np.maximum, ((f.bias >= th["bias_ha"][lp]) | (f.tx <= th["tx_la"][lp])).astype(float),
                          off, 0.0) > 0
        out.raw["dom_threshold"] = _t(dom) & in_service
        out.score["dom_threshold"] = nan_num(f.temp - th["temp_ha"], nan=0.0)
        has_dom = (g["optic_temperature_celsius"].last_ts > 0) | (g["optic_voltage_volts"].last_ts > 0) | has_bias
        any_th = np.zeros(P, bool)
        for key in ("temp_ha", "volt_ha", "volt_la", "bias_ha", "tx_la"):
            any_th |= np.isfinite(th[key])
        blk["dom_threshold"][~any_th] = 5
        blk["dom_threshold"][~has_dom] = 4

        # post-FEC: any uncorrectable codeword or symbol error (F10); unknown steps add nothing. Two
        # observations in a row confirm a trickle; a burst this large, across no flap and no link recovery
        # (an intermittent module's burst is the loose-module finding's), is traffic lost now
        pf = _t(f.post_fec > 0)
        out.raw["post_fec_errors"] = pf
        out.now["post_fec_errors"] = (_t(f.post_fec >= cfg.post_fec_burst) & ~_t(f.flaps > 0)
                                      & ~_t(f.recoveries > 0))
        out.score["post_fec_errors"] = np.log10(nan_num(f.post_fec, nan=0.0) + 1)
        fec_seen = c["port_fec_uncorrectable_codewords_total"].seen() | c["port_symbol_errors_total"].seen()
        err_seen = c["port_rx_fcs_errors_total"].seen() | c["port_rx_errors_total"].seen()
        blk["post_fec_errors"][~fec_seen & ~err_seen] = 6
        deg["post_fec_errors"] |= np.where(~fec_seen & err_seen, 1 << 5, 0).astype(np.uint16)

        # flap storm: >= flap_storm_count flaps within the storm window of data time (F31, however the polls
        # split them). A module that mostly retrains (recoveries and error bursts at least as many as its
        # flaps) is loose, not storming
        loose_sig = ((f.recovery_pen + f.burst_pen) >= 2) & ((f.recovery_pen + f.burst_pen) >= f.flap_pen)
        storm = (f.storm_since > 0) & (f.storm_since >= f.at_ms - cfg.flap_storm_window_s * 1000) & ~loose_sig
        out.raw["flap_storm"] = storm
        out.score["flap_storm"] = f.flaps_window.astype(float)
        fl_seen = c["port_link_down_events_total"].seen()
        alt_seen = c["port_carrier_changes_total"].seen() | (g["port_oper_up"].last_ts > 0)
        blk["flap_storm"][~fl_seen & ~alt_seen] = 8
        deg["flap_storm"] |= np.where(~fl_seen & alt_seen, 1 << 6, 0).astype(np.uint16)

        # pre-FEC BER close to the FEC limit, or well above its own baseline; not across a flap
        no_flap = ~_t(f.flaps > 0)
        ber = (f.ber_margin_dec < cfg.ber_margin_dec) | (f.log_ber_delta >= cfg.ber_jump_dec)
        # from corrected-bit counters: held when one of the cycle's rate windows held (as post-FEC errors in one
        # of its polls), so a rise late in a long cycle is not averaged away
        use, _, wins_hit = ber_windows(st)
        out.raw["ber_degradation"] = np.where(use, wins_hit > 0, _t(ber)) & no_flap
        set_ber_threshold(st)
        out.score["ber_degradation"] = nan_num(np.fmax(f.log_ber_delta, cfg.ber_margin_dec - f.ber_margin_dec),
                                                     nan=0.0)
        ber_counted = c["port_fec_corrected_bits_total"].seen() & c["port_rx_phy_bits_total"].seen()
        ber_gauge = (g["port_pre_fec_ber"].last_ts > 0) | (
            seg_reduce(np.maximum, (g["optic_pre_fec_ber"].last_ts > 0).astype(float), off, 0.0) > 0)
        blk["ber_degradation"][~ber_counted & ~ber_gauge] = 7
        deg["ber_degradation"] |= np.where(~ber_counted & ber_gauge, 1 << 7, 0).astype(np.uint16)

        # loose module: link recoveries, flaps and error-burst onsets (decayed, in data time), not a storm,
        # powers normal. Recoveries and bursts >= 2 with all >= 3 open it (one burst of several recoveries,
        # or two bursts and a flap; a lone recovery or flap never); it stays open while the penalty holds
        # (the open bar is read at the port's newest event, so a cycle that reads it later sees the same burst)
        total = f.recovery_pen + f.burst_pen + f.flap_pen
        ev_flap, ev_rec, ev_burst = f.event_pen
        trigger = ((ev_rec + ev_burst) >= 2) & ((ev_flap + ev_rec + ev_burst) >= 3)
        loose = (trigger | st.latched["loose_module"]) & (total >= cfg.loose_hold_penalty) & ~storm & ~optical
        out.raw["loose_module"] = loose
        out.score["loose_module"] = total
        rec_seen = c["port_link_error_recovery_total"].seen()
        blk["loose_module"][~(rec_seen | fl_seen | alt_seen | ber_counted | ber_gauge | fec_seen | err_seen)] = 9

        # NIC pause storm: stall counters, or ~100 % tx pause while draining ~nothing (F23-F25, F30); without a
        # line rate, "nothing" is an absolute floor
        drained = np.where(f.line_known, f.rx_util_low < cfg.pause_storm_rx_util,
                           f.rx_bps_low < cfg.pause_storm_rx_floor_bps)
        drained = np.where(np.isfinite(f.rx_util_low) | np.isfinite(f.rx_bps_low), drained, True)
        pstorm = _t(f.storm_events > 0) | (_t(f.tx_pause_duty >= cfg.pause_storm_duty) & drained)
        # counted per rate window (WINDOWED): a window holds at ~100 % pause (or brought a stall event); "draining
        # nothing" is read on the cycle's least-loaded window
        pause_n, ecn_n, ev_n, ev_hit = rate_windows(st)
        storm_hits = np.maximum(ev_hit, np.where(drained, pause_windows_at(st, cfg.pause_storm_duty), 0))
        storm_hits = np.where(fab.is_host, storm_hits, 0)
        pstorm = np.where((pause_n > 0) | (ev_n > 0), storm_hits > 0, _t(pstorm))
        out.raw["pause_storm"] = _t(pstorm) & fab.is_host
        out.hits["pause_storm"] = storm_hits
        out.score["pause_storm"] = nan_num(f.tx_pause_duty, nan=0.0)
        pause_seen = c["port_pfc_tx_pause_seconds_total"].seen().reshape(P, NPRIO).any(axis=1) | \
            c["port_tx_pause_seconds_total"].seen()
        storm_seen = c["port_pause_storm_warning_events_total"].seen() | \
            c["port_pause_storm_error_events_total"].seen()
        blk["pause_storm"][fab.is_host & ~pause_seen & ~storm_seen] = 10
        deg["pause_storm"] |= np.where(fab.is_host & pause_seen & ~f.line_known, 1 << 3, 0).astype(np.uint16)

        # host side: PCIe width/generation below the host's best GPU, no storm counters (F30, S10)
        dev = fab.dev
        D = len(fab.dev_names)
        w = np.where(np.isfinite(f.pcie_width), f.pcie_width, -1)
        gen = np.where(np.isfinite(f.pcie_gen), f.pcie_gen, -1)
        wmax = np.full(D, -1.0)
        gmax = np.full(D, -1.0)
        np.maximum.at(wmax, dev, w)
        np.maximum.at(gmax, dev, gen)
        pcie_drop = ((w >= 0) & (w < wmax[dev])) | ((gen >= 0) & (gen < gmax[dev]))
        out.raw["host_side"] = pcie_drop & fab.is_host & ~out.raw["pause_storm"]
        out.score["host_side"] = nan_num(f.tx_pause_duty_mean, nan=0.0)
        pcie_seen = (g["gpu_pcie_link_width"].last_ts > 0) | (g["gpu_pcie_link_generation"].last_ts > 0)
        blk["host_side"][fab.is_host & ~pcie_seen] = 11

        # congestion: ECN marking well above background, or pausing without a storm; a label, not a fault
        pausing = (f.tx_pause_duty_mean >= cfg.congestion_pause_duty) & ~out.raw["pause_storm"] & \
            ~out.raw["host_side"]
        cong = (f.ecn_frac >= cfg.congestion_ecn_frac) | pausing
        # counted per rate window (WINDOWED): an ECN window holds when its marked-packet rate is the share of the
        # cycle's rx packet rate, a pause window at the congestion duty (worst priority) unless the port storms
        pkt = c["port_rx_packets_total"].rate()
        ecn_thr = np.where(_t(pkt > 0), cfg.congestion_ecn_frac * pkt, np.nan)
        cong_hits = np.maximum(c["port_ecn_marked_packets_total"].windows_at(ecn_thr),
                               np.where(out.raw["pause_storm"] | out.raw["host_side"], 0,
                                        pause_windows_at(st, cfg.congestion_pause_duty)))
        cong = np.where((pause_n > 0) | (ecn_n > 0), cong_hits > 0, _t(cong))
        out.raw["congestion"] = _t(cong)
        out.hits["congestion"] = cong_hits
        out.score["congestion"] = nan_num(f.ecn_frac, nan=0.0)
        blk["congestion"][~c["port_ecn_marked_packets_total"].seen() & ~pause_seen] = 12

        # bias drift at the transmitter (laser wear-out, F7): level vs own baseline, or the robust slope
        bias_lane = (f.bias_drift >= cfg.bias_drift_frac) | (tt["bias_slope"] * 24 >= cfg.bias_slope_frac_per_day)
        bias = seg_reduce(np.maximum, (bias_lane & in_service[lp]).astype(float), off, 0.0) > 0
        out.raw["bias_drift"] = bias
        out.score["bias_drift"] = nan_num(seg_reduce(np.maximum, f.bias_drift, off), nan=0.0)

        # link down: a linked port whose readings have said oper-down for link_down_hold_ms, not admin-down
        # here or at the far end (an admin-down end takes the link down by design). Admin status unknown here:
        # only a run that began with an up -> down transition (a port never seen up may be unused or shut). The
        # newest reading must be recent: a device that stopped reporting is seen from the far end instead
        down_for = f.at_ms - st.down_since
        oper = st.gauges["port_oper_up"]
        fresh = (oper.last_ts > 0) & (f.at_ms - oper.last_ts <= cfg.max_gap_ms)
        admin_last = st.gauges["port_admin_up"].last
        admin_ok = np.where(np.isfinite(admin_last), admin_last >= 0.5, st.down_from_up)
        # the far end must have been read since the run began (it may be the port someone shut: a missed poll
        # there must not page), unless it never reports port state or has gone silent (two of its poll gaps)
        q = np.maximum(fab.peer, 0)
        peer_ts = np.maximum(oper.last_ts[q], st.gauges["port_admin_up"].last_ts[q])
        peer_known = (peer_ts == 0) | (peer_ts >= st.down_since) | \
            (f.at_ms - peer_ts >= np.maximum(2 * st.oper_gap[q], cfg.link_down_hold_ms))
        out.raw["link_down"] = ((st.down_since > 0) & (down_for >= cfg.link_down_hold_ms) & fresh
                                & (fab.peer >= 0) & admin_ok & ~_t(f.peer_admin_up < 0.5) & peer_known)
        out.score["link_down"] = np.where(st.down_since > 0, down_for / 60_000.0, 0.0)  # minutes down
        blk["link_down"][oper.last_ts == 0] = 13
        deg["link_down"] |= np.where(~np.isfinite(admin_last) & (oper.last_ts > 0), 1 << 4, 0).astype(np.uint16)
        blk["link_down"][(fab.peer < 0) & (blk["link_down"] == 0)] = 14
    for k, v in out.raw.items():
        out.raw[k] = np.asarray(v, bool).reshape(P)
    return out
