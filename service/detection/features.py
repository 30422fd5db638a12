"""Per-cycle features (detection.md section 2), as arrays over ports and lanes.

`compute` reads each metric's newest observation in a FeatureState (the readings of the latest cycle that
brought any, held until new ones come or they go stale) plus its rolling baselines, and returns plain
arrays; nothing here mutates the state. Missing data gives NaN, and every rule compares with NaN-safe
operators, so a gap raises nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.detection.state import NPRIO, FeatureState

_LOG_FLOOR = 1e-18
_F64_MAX = float(np.finfo(np.float64).max)


def nan_num(x: np.ndarray, nan: float = 0.0) -> np.ndarray:
    """`np.nan_to_num(x, nan=nan)` (NaN -> `nan`, +-inf -> the largest finite float), the same values, without
    its per-call overhead (it was a tenth of a replay cycle's array work, called ~30 times per cycle)."""
    if not (isinstance(x, np.ndarray) and x.dtype == np.float64):
        return np.nan_to_num(x, nan=nan)
    y = np.where(np.isnan(x), nan, x)
    np.maximum(y, -_F64_MAX, out=y)
    return np.minimum(y, _F64_MAX, out=y)


# Per packed-lane offsets array (a fabric's, kept alive here so its id is not reused): the reduceat starts and
# which segments are non-empty. A cycle reduces ~35 lane arrays over the same offsets
_SEG_PARTS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _seg_parts(off: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    hit = _SEG_PARTS.get((id(off), n))
    if hit is not None and hit[0] is off:
        return hit[1], hit[2]
    if len(_SEG_PARTS) >= 64:  # many fabrics (tests): start over
        _SEG_PARTS.clear()
    safe, nonempty = np.minimum(off[:-1], n - 1), np.diff(off) > 0
    _SEG_PARTS[(id(off), n)] = (off, safe, nonempty)
    return safe, nonempty


def seg_reduce(ufunc: np.ufunc, x: np.ndarray, off: np.ndarray, empty: float = np.nan) -> np.ndarray:
    """Per-port reduction of a packed lane array, NaN-aware for min/max."""
    if not len(x):
        return np.full(len(off) - 1, empty)
    fill = np.inf if ufunc is np.minimum else -np.inf
    y = np.where(np.isfinite(x), x, fill)
    safe, nonempty = _seg_parts(off, len(x))
    r = ufunc.reduceat(y, safe)
    r = np.where(nonempty, r, fill)
    return np.where(np.isfinite(r), r, empty)


def seg_argmin(x: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Lane number (within its port) of each port's minimum; 0 if all NaN."""
    P = len(off) - 1
    out = np.zeros(P, np.int64)
    if not len(x):
        return out
    mins = seg_reduce(np.minimum, x, off)
    port = np.repeat(np.arange(P), np.diff(off))
    hit = np.flatnonzero(x == mins[port])  # NaN never equals: all-NaN ports stay 0
    ports, first = np.unique(port[hit], return_index=True)
    out[ports] = hit[first] - off[ports]
    return out


@dataclass
class Features:
    at_ms: int
    # state
    oper_up: np.ndarray            # the newest oper observation's minimum (a down reading in it counts); NaN: none
    oper_hi: np.ndarray            # ... and its maximum (an up reading in it: a link that dropped came back)
    admin_up: np.ndarray
    peer_admin_up: np.ndarray
    # optics, lanes (packed)
    rx: np.ndarray
    rx_lo: np.ndarray              # the newest observation's lowest rx reading (a dark one among lit ones shows)
    rx_base: np.ndarray
    rx_delta: np.ndarray
    rx_margin_warn: np.ndarray
    rx_margin_alarm: np.ndarray
    rx_jitter: np.ndarray
    tx: np.ndarray
    tx_delta: np.ndarray
    bias: np.ndarray
    bias_drift: np.ndarray
    peer_tx_delta: np.ndarray      # the far transmitter's tx change, on the lane that feeds this receiver
    peer_bias_drift: np.ndarray
    peer_rx_delta: np.ndarray      # the far receiver's rx change on the same lane (both directions)
    # optics, ports
    rx_delta_min: np.ndarray
    rx_margin_min: np.ndarray
    rx_margin_alarm_min: np.ndarray
    worst_lane: np.ndarray
    lane_spread: np.ndarray
    lit: np.ndarray                # (P,) bool: some lane reads above Config.lit_dbm
    temp: np.ndarray
    temp_delta: np.ndarray
    volt: np.ndarray
    # FEC / BER
    log_ber: np.ndarray
    log_ber_peak: np.ndarray       # the worst rate sub-window's BER (a burst inside a long observation)
    ber_margin_dec: np.ndarray
    log_ber_delta: np.ndarray
    ber_from_gauge: np.ndarray     # (P,) bool: BER read from the device's gauge, not from counters
    post_fec: np.ndarray           # uncorrectable codewords + symbol errors (else FCS, else rx errors) in the obs.
    post_fec_from_fcs: np.ndarray  # (P,) bool
    fcs_errors: np.ndarray
    # link state
    flaps: np.ndarray              # flaps in the newest counter observation
    flaps_window: np.ndarray       # flaps within Config.flap_storm_window_s of data time (capped at the ring)
    storm_since: np.ndarray        # data time of the flap_storm_count-th newest flap (0: fewer)
    recoveries: np.ndarray
    flap_pen: np.ndarray           # decayed counts at the cycle time (loose-module memory)
    recovery_pen: np.ndarray
    burst_pen: np.ndarray
    event_pen: np.ndarray          # (3, P) flap, recovery, burst counts at the port's newest event (data time)
    # congestion and flow control
    tx_pause_duty: np.ndarray      # worst priority, worst rate sub-window
    tx_pause_duty_mean: np.ndarray  # worst priority, over the observation
    rx_pause_duty: np.ndarray
    storm_events: np.ndarray
    rx_util: np.ndarray            # over the observation
    rx_util_low: np.ndarray        # the least-loaded rate sub-window
    rx_bps_low: np.ndarray
    line_known: np.ndarray         # (P,) bool: a line rate is known (inventory, speed gauge or rx phy bits)
    ecn_frac: np.ndarray
    cnp_rate: np.ndarray
    # RoCE transport (host NICs): per second over the observation; NaN where not reported
    roce_retx_rate: np.ndarray     # NAK sequence errors, implied NAKs, duplicate requests, adaptive retransmits
    roce_timeout_rate: np.ndarray  # local ACK timeouts, adaptive retransmission timeouts
    icrc_rate: np.ndarray          # RoCE packets with a bad ICRC
    pcie_width: np.ndarray
    pcie_gen: np.ndarray
    # cohort
    rx_margin_cohort_z: np.ndarray
    rx_margin_cohort_med: np.ndarray


def group_median_mad(x: np.ndarray, g: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of x per group (NaN ignored; NaN for empty groups), by one sort."""
    med = np.full(n_groups, np.nan)
    mad = np.full(n_groups, np.nan)
    ok = np.isfinite(x)
    if not ok.any():
        return med, mad
    xs, gs = x[ok], g[ok]
    for arr, out in ((xs, med), (None, mad)):
        vals = arr if arr is not None else np.abs(xs - med[gs])
        order = np.lexsort((vals, gs))
        sv, sg = vals[order], gs[order]
        counts = np.bincount(sg, minlength=n_groups)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        has = counts > 0
        lo = starts + (counts - 1) // 2
        hi = starts + counts // 2
        out[has] = 0.5 * (sv[lo[has]] + sv[hi[has]])
    return med, mad


def _worst_prio(x: np.ndarray, P: int) -> np.ndarray:
    """Per port, the largest finite value over priorities (NaN when none), clipped to [0, 1] (a duty)."""
    y = np.where(np.isfinite(x), x, -1.0).reshape(P, NPRIO).max(axis=1)
    return np.where(y < 0, np.nan, np.clip(y, 0.0, 1.0))


def _rate_sum(c: dict, metrics: tuple[str, ...]) -> np.ndarray:
    """Per port, the summed per-second rate of the counters that report (NaN where none does)."""
    rates = [c[m].rate() for m in metrics]
    seen = np.zeros(len(rates[0]), bool)
    for r in rates:
        seen |= np.isfinite(r)
    return np.where(seen, sum(nan_num(r, nan=0.0) for r in rates), np.nan)


def at_newest_event(st: FeatureState) -> np.ndarray:
    """The loose-module penalties as they stood at each port's newest event: what a burst amounted to when it
    happened, whenever a cycle reads it (a cycle 15 min later must not see it decayed below the open bar)."""
    pens = (st.pen["flap"], st.pen["recovery"], st.pen["burst"])
    newest = np.maximum.reduce([d.t for d in pens])
    return np.stack([d.value(newest) for d in pens])


def compute(st: FeatureState, at_ms: int) -> Features:
    """Features of each metric's newest observation (held while no new data comes) against the baselines."""
    fab, cfg = st.fabric, st.cfg
    P, off, lp = fab.P, fab.lane_off, fab.lane_port
    g, c = st.gauges, st.counters
    peer = fab.peer
    has_peer = peer >= 0
    pp = np.where(has_peer, peer, 0)

    with np.errstate(invalid="ignore", divide="ignore"):
        # an oper-down or admin-down reading anywhere in the newest observation counts
        oper_w = g["port_oper_up"].h_min
        admin_w = g["port_admin_up"].h_min
        peer_admin = np.where(has_peer, admin_w[pp], np.nan)
        rx = g["optic_rx_power_dbm"].h_mean
        tx = g["optic_tx_power_dbm"].h_mean
        bias = g["optic_tx_bias_amperes"].h_mean
        rx_base = st.base["rx"].loc
        rx_delta = rx - rx_base
        tx_delta = tx - st.base["tx"].loc
        bias_drift = bias / st.base["bias"].loc - 1.0
        rx_lw, rx_la = fab.th["rx_lw"][lp], fab.th["rx_la"][lp]
        rx_margin_warn = rx - rx_lw
        rx_margin_alarm = rx - rx_la
        # the far end's lane k feeds this end's lane k (same lane order at both ends of a cable)
        peer_lane = np.where(has_peer[lp], fab.lane_index(pp[lp], fab.lane_no), -1)
        okl = peer_lane >= 0
        pl = np.maximum(peer_lane, 0)
        peer_tx_delta = np.where(okl, tx_delta[pl] if len(pl) else pl, np.nan)
        peer_bias_drift = np.where(okl, bias_drift[pl] if len(pl) else pl, np.nan)
        peer_rx_delta = np.where(okl, rx_delta[pl] if len(pl) else pl, np.nan)

        rx_delta_min = seg_reduce(np.minimum, rx_delta, off)
        rx_margin_min = seg_reduce(np.minimum, rx_margin_warn, off)
        rx_margin_alarm_min = seg_reduce(np.minimum, rx_margin_alarm, off)
        worst_lane = seg_argmin(np.where(np.isfinite(rx_delta), rx_delta, rx_margin_warn), off)
        lane_spread = seg_reduce(np.maximum, rx_delta, off) - rx_delta_min
        lit = seg_reduce(np.maximum, rx, off) > cfg.lit_dbm
        temp = g["optic_temperature_celsius"].h_mean
        temp_delta = temp - st.base["temp"].loc
        volt = g["optic_voltage_volts"].h_mean

        # pre-FEC BER: corrected bits / rx phy bits (F14), else the device's own gauge (port, else worst lane)
        corr, bits = c["port_fec_corrected_bits_total"], c["port_rx_phy_bits_total"]
        counted = (bits.h_ms > 0) & (bits.h_acc > 0) & (corr.h_ms > 0)
        ber_c = np.where(counted, corr.h_acc / bits.h_acc, np.nan)
        bits_rate = bits.rate()
        ber_c_peak = np.where(counted, corr.h_pk / bits_rate, np.nan)
        gport, glane = g["port_pre_fec_ber"], g["optic_pre_fec_ber"]
        lane_ber = seg_reduce(np.maximum, glane.h_mean, off)
        ber_g = np.where(np.isfinite(gport.h_mean), gport.h_mean, lane_ber)
        ber_g_peak = np.where(np.isfinite(gport.h_max), gport.h_max, lane_ber)
        from_gauge = ~np.isfinite(ber_c) & np.isfinite(ber_g)
        ber = np.where(np.isfinite(ber_c), ber_c, ber_g)
        ber_peak = np.where(np.isfinite(ber_c), np.fmax(ber_c_peak, ber_c), ber_g_peak)
        log_ber = np.where(np.isfinite(ber), np.log10(np.maximum(ber, _LOG_FLOOR)), np.nan)
        log_ber_peak = np.where(np.isfinite(ber_peak), np.log10(np.maximum(ber_peak, _LOG_FLOOR)), np.nan)
        ber_margin = np.log10(fab.fec_limit) - log_ber
        log_ber_delta = log_ber - st.base["logber"].loc

        # post-FEC: uncorrectable codewords + symbol errors (F10); where a device has neither, the frames FEC
        # could not correct show as FCS/CRC errors (F12), else as rx errors
        ucw, sym = c["port_fec_uncorrectable_codewords_total"], c["port_symbol_errors_total"]
        fcs, rxe = c["port_rx_fcs_errors_total"], c["port_rx_errors_total"]
        fec_seen = ucw.seen() | sym.seen()
        fec = np.where((ucw.h_ms > 0) | (sym.h_ms > 0), nan_num(ucw.held()) + nan_num(sym.held()),
                       np.nan)
        fcs_v = np.where(fcs.seen(), fcs.held(), rxe.held())
        post_fec = np.where(fec_seen, fec, fcs_v)
        post_fec_from_fcs = ~fec_seen & np.isfinite(fcs_v)

        fl, car = c["port_link_down_events_total"], c["port_carrier_changes_total"]
        flaps = np.where(fl.seen(), fl.held(), np.floor(car.held() / 2 + 0.5))
        wms = cfg.flap_storm_window_s * 1000
        flaps_window = st.flaps.count_since(at_ms - wms)
        storm_since = st.flaps.nth_newest(cfg.flap_storm_count)
        recoveries = c["port_link_error_recovery_total"].held()

        # pause duty per priority (PFC), else global pause; the worst priority, the worst rate sub-window
        txp, rxp, gtx = c["port_pfc_tx_pause_seconds_total"], c["port_pfc_rx_pause_seconds_total"], \
            c["port_tx_pause_seconds_total"]
        pfc_seen = txp.seen().reshape(P, NPRIO).any(axis=1)
        tx_pause_duty = np.where(pfc_seen, _worst_prio(txp.h_pk, P), np.clip(gtx.h_pk, 0, 1))
        tx_pause_duty_mean = np.where(pfc_seen, _worst_prio(txp.rate(), P), np.clip(gtx.rate(), 0, 1))
        rx_pause_duty = _worst_prio(rxp.rate(), P)
        sw, se = c["port_pause_storm_warning_events_total"], c["port_pause_storm_error_events_total"]
        storm = np.where((sw.h_ms > 0) | (se.h_ms > 0), nan_num(sw.held()) + nan_num(se.held()),
                         np.nan)
        rxb = c["port_rx_bytes_total"]
        speed = np.where(np.isfinite(fab.speed_bps), fab.speed_bps, g["port_speed_bits_per_second"].last)
        speed = np.where(np.isfinite(speed) & (speed > 0), speed, bits_rate)  # rx phy bits: line rate (F14)
        line_known = np.isfinite(speed) & (speed > 0)
        rx_util = rxb.rate() * 8.0 / speed
        rx_bps_low = rxb.h_lo * 8.0
        rx_util_low = rx_bps_low / speed
        rxpk = c["port_rx_packets_total"]
        ecn = c["port_ecn_marked_packets_total"]
        ecn_frac = np.where((ecn.h_ms > 0) & (rxpk.h_acc > 0), ecn.h_acc / np.maximum(rxpk.h_acc, 1), np.nan)
        cnp_rate = c["port_cnp_sent_total"].rate()
        roce_retx_rate = _rate_sum(c, ("port_nak_sequence_errors_total", "port_implied_nak_sequence_errors_total",
                                       "port_duplicate_requests_total", "port_adaptive_retransmits_total"))
        roce_timeout_rate = _rate_sum(c, ("port_local_ack_timeouts_total",
                                          "port_adaptive_retransmit_timeouts_total"))
        icrc_rate = c["port_icrc_errors_total"].rate()

        z_med, z_mad = group_median_mad(rx_margin_min, fab.cohort, len(fab.cohort_names))
        scale = np.maximum(1.4826 * z_mad, 0.5)[fab.cohort]
        rx_z = (rx_margin_min - z_med[fab.cohort]) / scale

    return Features(
        at_ms=at_ms, oper_up=oper_w, oper_hi=g["port_oper_up"].h_max.copy(), admin_up=admin_w, peer_admin_up=peer_admin,
        rx=rx, rx_lo=g["optic_rx_power_dbm"].h_min.copy(), rx_base=rx_base, rx_delta=rx_delta,
        rx_margin_warn=rx_margin_warn, rx_margin_alarm=rx_margin_alarm,
        rx_jitter=st.rx_jitter.copy(), tx=tx, tx_delta=tx_delta, bias=bias, bias_drift=bias_drift,
        peer_tx_delta=peer_tx_delta, peer_bias_drift=peer_bias_drift, peer_rx_delta=peer_rx_delta,
        rx_delta_min=rx_delta_min, rx_margin_min=rx_margin_min, rx_margin_alarm_min=rx_margin_alarm_min,
        worst_lane=worst_lane, lane_spread=lane_spread, lit=lit, temp=temp, temp_delta=temp_delta, volt=volt,
        log_ber=log_ber, log_ber_peak=log_ber_peak, ber_margin_dec=np.where(np.isfinite(ber), ber_margin, np.nan),
        log_ber_delta=np.where(np.isfinite(ber), log_ber_delta, np.nan), ber_from_gauge=from_gauge,
        post_fec=post_fec, post_fec_from_fcs=post_fec_from_fcs, fcs_errors=fcs_v,
        flaps=flaps, flaps_window=flaps_window, storm_since=storm_since, recoveries=recoveries,
        flap_pen=st.pen["flap"].value(at_ms), recovery_pen=st.pen["recovery"].value(at_ms),
        burst_pen=st.pen["burst"].value(at_ms), event_pen=at_newest_event(st),
        tx_pause_duty=tx_pause_duty, tx_pause_duty_mean=tx_pause_duty_mean, rx_pause_duty=rx_pause_duty,
        storm_events=storm, rx_util=rx_util, rx_util_low=rx_util_low, rx_bps_low=rx_bps_low, line_known=line_known,
        ecn_frac=ecn_frac, cnp_rate=cnp_rate, roce_retx_rate=roce_retx_rate, roce_timeout_rate=roce_timeout_rate,
        icrc_rate=icrc_rate, pcie_width=g["gpu_pcie_link_width"].h_mean.copy(),
        pcie_gen=g["gpu_pcie_link_generation"].h_mean.copy(),
        rx_margin_cohort_z=rx_z, rx_margin_cohort_med=z_med[fab.cohort],
    )


# Layer-2 (IsolationForest) inputs: physical family only, per port, transformed as detection.md 2 suggests.
IF_FEATURES = ("rx_margin_min", "rx_delta_min", "lane_spread", "tx_delta_min", "bias_drift_max", "log_ber",
               "log_ber_delta", "temp_delta", "rx_jitter_max", "flap_log")


def if_matrix(f: Features, st: FeatureState) -> np.ndarray:
    """(P, len(IF_FEATURES)) float64; NaN left in place (the forest layer imputes the cohort median)."""
    off = st.fabric.lane_off
    with np.errstate(invalid="ignore"):
        cols = [
            f.rx_margin_min, f.rx_delta_min, f.lane_spread,
            seg_reduce(np.minimum, f.tx_delta, off), seg_reduce(np.maximum, f.bias_drift, off),
            f.log_ber, f.log_ber_delta, f.temp_delta, seg_reduce(np.maximum, f.rx_jitter, off),
            np.log1p(np.maximum(f.flap_pen + f.recovery_pen, 0)),
        ]
    return np.column_stack(cols).astype(np.float64)
