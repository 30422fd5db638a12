"""Per-cycle features (detection.md section 2), as arrays over ports and lanes.

`compute` reads one cycle window of a FeatureState (what arrived since the last cycle) plus
its rolling baselines, and returns plain arrays; nothing here mutates the state. Missing data
gives NaN, and every rule compares with NaN-safe operators, so a gap raises nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.detection.state import NPRIO, FeatureState

_LOG_FLOOR = 1e-18


def seg_reduce(ufunc: np.ufunc, x: np.ndarray, off: np.ndarray, empty: float = np.nan) -> np.ndarray:
    """Per-port reduction of a packed lane array, NaN-aware for min/max."""
    if not len(x):
        return np.full(len(off) - 1, empty)
    fill = np.inf if ufunc is np.minimum else -np.inf
    y = np.where(np.isfinite(x), x, fill)
    starts = off[:-1]
    safe = np.minimum(starts, len(x) - 1)
    r = ufunc.reduceat(y, safe)
    r = np.where(np.diff(off) > 0, r, fill)
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
    oper_up: np.ndarray
    admin_up: np.ndarray
    peer_admin_up: np.ndarray
    # optics, lanes (packed)
    rx: np.ndarray
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
    temp: np.ndarray
    temp_delta: np.ndarray
    volt: np.ndarray
    # FEC / BER
    log_ber: np.ndarray
    ber_margin_dec: np.ndarray
    log_ber_delta: np.ndarray
    post_fec: np.ndarray           # uncorrectable codewords + symbol errors in the window
    # link state
    flaps: np.ndarray
    flap_peak: np.ndarray
    flap_peak_rate: np.ndarray     # the worst step's flaps per storm window (Config.flap_storm_window_s)
    recoveries: np.ndarray
    # congestion and flow control
    tx_pause_duty: np.ndarray
    rx_pause_duty: np.ndarray
    storm_events: np.ndarray
    rx_util: np.ndarray
    ecn_frac: np.ndarray
    cnp_rate: np.ndarray
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


def _sum_prio(x: np.ndarray, P: int) -> np.ndarray:
    return x.reshape(P, NPRIO).sum(axis=1)


def compute(st: FeatureState, at_ms: int) -> Features:
    """Features of the current window (since the last cycle) against the rolling baselines."""
    fab = st.fabric
    P, off, lp = fab.P, fab.lane_off, fab.lane_port
    g, c = st.gauges, st.counters
    peer = fab.peer
    has_peer = peer >= 0
    pp = np.where(has_peer, peer, 0)

    def win(metric: str) -> np.ndarray:
        return g[metric].mean()

    with np.errstate(invalid="ignore", divide="ignore"):
        oper = g["port_oper_up"].last
        admin = g["port_admin_up"].last
        # an oper-down or admin-down reading anywhere in the window counts
        oper_w = np.where(g["port_oper_up"].w_n > 0, g["port_oper_up"].w_min, oper)
        admin_w = np.where(g["port_admin_up"].w_n > 0, g["port_admin_up"].w_min, admin)
        peer_admin = np.where(has_peer, admin_w[pp], np.nan)
        rx = win("optic_rx_power_dbm")
        tx = win("optic_tx_power_dbm")
        bias = win("optic_tx_bias_amperes")
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
        temp = win("optic_temperature_celsius")
        temp_delta = temp - st.base["temp"].loc
        volt = win("optic_voltage_volts")

        corr, bits = c["port_fec_corrected_bits_total"], c["port_rx_phy_bits_total"]
        ber = np.where((bits.acc_ms > 0) & (bits.acc > 0) & (corr.acc_ms > 0), corr.acc / bits.acc, np.nan)
        log_ber = np.log10(np.maximum(ber, _LOG_FLOOR))
        ber_margin = np.log10(fab.fec_limit) - log_ber
        log_ber_delta = log_ber - st.base["logber"].loc
        ucw, sym = c["port_fec_uncorrectable_codewords_total"], c["port_symbol_errors_total"]
        post_fec = np.where((ucw.acc_ms > 0) | (sym.acc_ms > 0), ucw.acc + sym.acc, np.nan)

        fl = c["port_link_down_events_total"]
        flaps = np.where(fl.acc_ms > 0, fl.acc, np.nan)
        win = st.cfg.flap_storm_window_s
        flap_peak_rate = np.where(fl.peak_ms > 0, fl.peak / np.maximum(fl.peak_ms / 1000.0, win) * win, 0.0)
        rec = c["port_link_error_recovery_total"]
        recoveries = np.where(rec.acc_ms > 0, rec.acc, np.nan)

        txp, rxp = c["port_pfc_tx_pause_seconds_total"], c["port_pfc_rx_pause_seconds_total"]
        # duty per priority, worst priority: a storm is usually on the one lossless class
        tx_duty = np.where(txp.acc_ms > 0, txp.acc * 1000.0 / np.maximum(txp.acc_ms, 1), np.nan)
        rx_duty = np.where(rxp.acc_ms > 0, rxp.acc * 1000.0 / np.maximum(rxp.acc_ms, 1), np.nan)
        tx_pause_duty = np.clip(np.nanmax(np.where(np.isfinite(tx_duty), tx_duty, -1).reshape(P, NPRIO), 1), -1, 1)
        tx_pause_duty = np.where(tx_pause_duty < 0, np.nan, tx_pause_duty)
        rx_pause_duty = np.clip(np.nanmax(np.where(np.isfinite(rx_duty), rx_duty, -1).reshape(P, NPRIO), 1), -1, 1)
        rx_pause_duty = np.where(rx_pause_duty < 0, np.nan, rx_pause_duty)
        sw, se = c["port_pause_storm_warning_events_total"], c["port_pause_storm_error_events_total"]
        storm = np.where((sw.acc_ms > 0) | (se.acc_ms > 0), sw.acc + se.acc, np.nan)
        rxb = c["port_rx_bytes_total"]
        speed = np.where(np.isfinite(fab.speed_bps), fab.speed_bps, g["port_speed_bits_per_second"].last)
        rx_util = np.where(rxb.acc_ms > 0, rxb.acc * 8000.0 / np.maximum(rxb.acc_ms, 1) / speed, np.nan)
        rxpk = c["port_rx_packets_total"]
        ecn = c["port_ecn_marked_packets_total"]
        ecn_frac = np.where((ecn.acc_ms > 0) & (rxpk.acc > 0), ecn.acc / np.maximum(rxpk.acc, 1), np.nan)
        cnp_rate = c["port_cnp_sent_total"].rate()

        z_med, z_mad = group_median_mad(rx_margin_min, fab.cohort, len(fab.cohort_names))
        scale = np.maximum(1.4826 * z_mad, 0.5)[fab.cohort]
        rx_z = (rx_margin_min - z_med[fab.cohort]) / scale

    return Features(
        at_ms=at_ms, oper_up=oper_w, admin_up=admin_w, peer_admin_up=peer_admin,
        rx=rx, rx_base=rx_base, rx_delta=rx_delta, rx_margin_warn=rx_margin_warn, rx_margin_alarm=rx_margin_alarm,
        rx_jitter=st.rx_jitter.copy(), tx=tx, tx_delta=tx_delta, bias=bias, bias_drift=bias_drift,
        peer_tx_delta=peer_tx_delta, peer_bias_drift=peer_bias_drift, peer_rx_delta=peer_rx_delta,
        rx_delta_min=rx_delta_min, rx_margin_min=rx_margin_min, rx_margin_alarm_min=rx_margin_alarm_min,
        worst_lane=worst_lane, lane_spread=lane_spread, temp=temp, temp_delta=temp_delta, volt=volt,
        log_ber=np.where(np.isfinite(ber), log_ber, np.nan), ber_margin_dec=np.where(np.isfinite(ber), ber_margin,
                                                                                      np.nan),
        log_ber_delta=np.where(np.isfinite(ber), log_ber_delta, np.nan), post_fec=post_fec,
        flaps=flaps, flap_peak=fl.peak.copy(), flap_peak_rate=flap_peak_rate, recoveries=recoveries,
        tx_pause_duty=tx_pause_duty, rx_pause_duty=rx_pause_duty, storm_events=storm, rx_util=rx_util,
        ecn_frac=ecn_frac, cnp_rate=cnp_rate, pcie_width=g["gpu_pcie_link_width"].last.copy(),
        pcie_gen=g["gpu_pcie_link_generation"].last.copy(),
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
            np.log1p(np.maximum(st.penalty["flap"] + st.penalty["recovery"], 0)),
        ]
    return np.column_stack(cols).astype(np.float64)
