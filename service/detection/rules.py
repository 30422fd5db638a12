"""Layer 0 (and the raw per-cycle conditions of layers 1-2): which ports show which condition now.

Each condition is a boolean array over ports plus a score (larger is worse). Nothing here
decides cause, end or persistence (attribution.py does); this module only answers "does
the signal cross its threshold in this window", with guard rails: admin-down ends, missing
data and unknown counter steps never make a condition true.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.detection.features import Features, seg_reduce
from service.detection.state import FeatureState


@dataclass
class Conditions:
    raw: dict[str, np.ndarray] = field(default_factory=dict)     # kind -> (P,) bool
    now: dict[str, np.ndarray] = field(default_factory=dict)     # kind -> (P,) bool: fire without k of n
    score: dict[str, np.ndarray] = field(default_factory=dict)   # kind -> (P,) float
    lane_deg: np.ndarray | None = None                           # (L,) bool: degraded optical lanes
    optics_ok: np.ndarray | None = None


def _t(x: np.ndarray) -> np.ndarray:
    """NaN-safe truth: NaN is False."""
    return np.nan_to_num(x, nan=0.0).astype(bool) if x.dtype != bool else x


def evaluate(f: Features, st: FeatureState) -> Conditions:
    fab, cfg = st.fabric, st.cfg
    off, lp = fab.lane_off, fab.lane_port
    P = fab.P
    out = Conditions()
    with np.errstate(invalid="ignore"):
        # guard: an admin-down end reads 0 mW / -40 dBm on both sides of the link by design, and so does a
        # port that was oper-down in the window: no light is the link-down finding, never an optical one
        optics_ok = (f.admin_up != 0) & (f.peer_admin_up != 0) & np.isfinite(f.admin_up) & (f.oper_up != 0)
        out.optics_ok = optics_ok
        tt = st.lane_trend
        trend_lane = (tt["ttt_warn"] <= cfg.ttt_warn_hours) & (tt["rx_slope"] * 24 <= -cfg.trend_slope_db_per_day)
        lane_deg = (f.rx_delta <= -cfg.rx_drop_db) | (f.rx_margin_warn < 0) | trend_lane
        lane_deg &= optics_ok[lp] & np.isfinite(f.rx)
        out.lane_deg = lane_deg
        deg_port = seg_reduce(np.maximum, lane_deg.astype(float), off, 0.0) > 0
        # far below the cohort and close to the module's own warning: catches faults older than the baseline
        cohort_low = ((f.rx_margin_cohort_z < -6) & (f.rx_margin_min < 1.5)
                      & (f.rx_margin_cohort_med - f.rx_margin_min >= 3.0) & optics_ok)
        optical = deg_port | cohort_low
        out.raw["optical_degradation"] = optical
        out.score["optical_degradation"] = np.fmax(-np.nan_to_num(f.rx_delta_min, nan=0.0),
                                                   -np.nan_to_num(f.rx_margin_min, nan=0.0))

        th = fab.th
        dom = ((f.temp >= th["temp_ha"]) | (f.volt >= th["volt_ha"]) | (f.volt <= th["volt_la"]))
        dom |= seg_reduce(np.maximum, ((f.bias >= th["bias_ha"][lp]) | (f.tx <= th["tx_la"][lp])).astype(float),
                          off, 0.0) > 0
        out.raw["dom_threshold"] = _t(dom) & optics_ok & (f.oper_up != 0)
        out.score["dom_threshold"] = np.nan_to_num(f.temp - th["temp_ha"], nan=0.0)

        # post-FEC: any uncorrectable codeword or symbol error (F10); unknown steps add nothing. Two
        # intervals in a row confirm a trickle; a burst this large across no flap is traffic lost now
        pf = _t(f.post_fec > 0)
        out.raw["post_fec_errors"] = pf
        out.now["post_fec_errors"] = _t(f.post_fec >= cfg.post_fec_burst) & ~_t(f.flaps > 0)
        out.score["post_fec_errors"] = np.log10(np.nan_to_num(f.post_fec, nan=0.0) + 1)

        # flap storm: >= 5 flaps within one storm window (F31); an isolated flap never qualifies
        storm = (f.flap_peak >= cfg.flap_storm_count) & (f.flap_peak_rate >= cfg.flap_storm_count)
        out.raw["flap_storm"] = storm
        out.score["flap_storm"] = f.flap_peak_rate

        # pre-FEC BER close to the FEC limit, or well above its own baseline; not across a flap
        no_flap = ~_t(f.flaps > 0)
        ber = ((f.ber_margin_dec < cfg.ber_margin_dec) | (f.log_ber_delta >= cfg.ber_jump_dec)) & no_flap
        out.raw["ber_degradation"] = _t(ber)
        out.score["ber_degradation"] = np.nan_to_num(np.fmax(f.log_ber_delta, cfg.ber_margin_dec - f.ber_margin_dec),
                                                     nan=0.0)

        # loose module: link recoveries with error bursts (decayed penalties), not a storm, powers normal.
        # One burst of several recoveries, or recoveries with a BER burst and a flap, opens it; it stays
        # open while the decayed penalty holds, so each later burst does not open a new alert
        pen = st.penalty
        total = pen["recovery"] + pen["burst"] + pen["flap"]
        trigger = ((pen["recovery"] + pen["burst"]) >= 2) & (total >= 3)
        loose = (trigger | (st.latched["loose_module"] & (total >= cfg.loose_hold_penalty))) & ~storm & ~optical
        out.raw["loose_module"] = loose
        out.score["loose_module"] = pen["recovery"] + pen["burst"] + pen["flap"]

        # NIC pause storm: stall counters, or ~100 % tx pause while draining ~nothing (F23-F25, F30)
        pstorm = _t(f.storm_events > 0) | ((f.tx_pause_duty >= cfg.pause_storm_duty)
                                           & (np.nan_to_num(f.rx_util, nan=0.0) < cfg.pause_storm_rx_util))
        out.raw["pause_storm"] = _t(pstorm) & fab.is_host
        out.score["pause_storm"] = np.nan_to_num(f.tx_pause_duty, nan=0.0)

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
        out.score["host_side"] = np.nan_to_num(f.tx_pause_duty, nan=0.0)

        # congestion: ECN marking well above background, or pausing without a storm; a label, not a fault
        pausing = (f.tx_pause_duty >= cfg.congestion_pause_duty) & ~out.raw["pause_storm"] & ~out.raw["host_side"]
        cong = (f.ecn_frac >= cfg.congestion_ecn_frac) | pausing
        out.raw["congestion"] = _t(cong)
        out.score["congestion"] = np.nan_to_num(f.ecn_frac, nan=0.0)

        # bias drift at the transmitter (laser wear-out, F7): level vs own baseline, or the robust slope
        bias_lane = (f.bias_drift >= cfg.bias_drift_frac) | (tt["bias_slope"] * 24 >= cfg.bias_slope_frac_per_day)
        bias = seg_reduce(np.maximum, (bias_lane & optics_ok[lp]).astype(float), off, 0.0) > 0
        out.raw["bias_drift"] = bias
        out.score["bias_drift"] = np.nan_to_num(seg_reduce(np.maximum, f.bias_drift, off), nan=0.0)

        # link down: a linked port whose readings have said oper-down for link_down_hold_ms, admin up here
        # (known) and not admin-down at the far end (an admin-down end takes the link down by design). The
        # newest reading must be recent: a device that stopped reporting is seen from the far end instead
        down_for = f.at_ms - st.down_since
        oper = st.gauges["port_oper_up"]
        fresh = (oper.last_ts > 0) & (f.at_ms - oper.last_ts <= cfg.max_gap_ms)
        out.raw["link_down"] = ((st.down_since > 0) & (down_for >= cfg.link_down_hold_ms) & fresh
                                & (fab.peer >= 0) & _t(f.admin_up >= 0.5) & ~_t(f.peer_admin_up < 0.5))
        out.score["link_down"] = np.where(st.down_since > 0, down_for / 60_000.0, 0.0)  # minutes down
    for k, v in out.raw.items():
        out.raw[k] = np.asarray(v, bool).reshape(P)
    return out
