"""Rolling detection state: the fabric as arrays, and per-metric tracks fed in data-time order.

Everything is an array over entities (ports, lanes, port x priority), never a Python object
per port, so a 300k-port fabric is a few hundred numpy arrays. `FeatureState.observe` takes
samples in timestamp order (a batch may hold several samples of one entity; they are applied
in rounds, one per entity per round, so the result does not depend on how samples were
batched). Counter increases follow service.telemetry.counters.increase exactly: the common
case (no drop, no saturation) is computed vectorised, and every other element goes through
`increase()` itself.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.telemetry import catalogue
from service.telemetry.counters import increase

NPRIO = 8
GAUGE_PORT = ("port_oper_up", "port_admin_up", "port_speed_bits_per_second", "optic_temperature_celsius",
              "optic_voltage_volts")
GAUGE_LANE = ("optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes")
GAUGE_GPU = ("gpu_pcie_link_width", "gpu_pcie_link_generation")
COUNTER_PORT = ("port_link_down_events_total", "port_link_error_recovery_total", "port_rx_bytes_total",
                "port_rx_packets_total", "port_rx_phy_bits_total", "port_fec_corrected_bits_total",
                "port_fec_uncorrectable_codewords_total", "port_symbol_errors_total",
                "port_ecn_marked_packets_total", "port_cnp_sent_total", "port_pause_storm_warning_events_total",
                "port_pause_storm_error_events_total")
COUNTER_PRIO = ("port_pfc_tx_pause_seconds_total", "port_pfc_rx_pause_seconds_total")
# metric -> entity axis it is stored on
AXIS: dict[str, str] = {**{m: "port" for m in GAUGE_PORT + COUNTER_PORT}, **{m: "lane" for m in GAUGE_LANE},
                        **{m: "port" for m in GAUGE_GPU}, **{m: "prio" for m in COUNTER_PRIO}}
USED_METRICS = tuple(AXIS)

NRZ_FEC_LIMIT = 5e-5   # KR4 RS(528,514), detection.md F11 [UNVERIFIED]
PAM4_FEC_LIMIT = 2.4e-4  # KP4 RS(544,514), detection.md F9
_TH_KEYS = (("rx_power_dbm", "rx"), ("tx_power_dbm", "tx"), ("tx_bias_amperes", "bias"),
            ("temperature_celsius", "temp"), ("voltage_volts", "volt"))
_TH_LEVELS = (("low_alarm", "la"), ("low_warning", "lw"), ("high_warning", "hw"), ("high_alarm", "ha"))


@dataclass
class Fabric:
    """The inventory as flat arrays; ports are the entity axis, lanes are packed per port."""

    port_ids: np.ndarray            # (P,) ports.id
    port_names: list[str]
    dev: np.ndarray                 # (P,) index into dev_names
    dev_names: list[str]
    dev_roles: list[str]
    peer: np.ndarray                # (P,) port index at the other end of the link, -1 if none
    n_lanes: np.ndarray             # (P,)
    speed_bps: np.ndarray           # (P,) nominal, NaN if unknown
    cohort: np.ndarray              # (P,) index into cohort_names
    cohort_names: list[str]
    fec_limit: np.ndarray           # (P,)
    copper: np.ndarray              # (P,) bool: DAC/AOC assemblies, where the cable is the module
    th: dict[str, np.ndarray]       # e.g. "rx_lw" -> (P,), NaN where the module gives none
    gpu_port: dict[tuple[int, int], int] = field(default_factory=dict)  # (dev index, gpu) -> port
    lane_off: np.ndarray = field(init=False)
    lane_port: np.ndarray = field(init=False)
    lane_no: np.ndarray = field(init=False)
    port_index: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.n_lanes = np.clip(np.asarray(self.n_lanes, np.int64), 1, NPRIO)
        self.dev = np.asarray(self.dev, np.int64)
        self.peer = np.asarray(self.peer, np.int64)
        self.cohort = np.asarray(self.cohort, np.int64)
        self.port_ids = np.asarray(self.port_ids, np.int64)
        self.lane_off = np.concatenate([[0], np.cumsum(self.n_lanes)]).astype(np.int64)
        self.lane_port = np.repeat(np.arange(self.P), self.n_lanes)
        self.lane_no = np.arange(self.L) - self.lane_off[self.lane_port]
        self.port_index = {int(p): i for i, p in enumerate(self.port_ids.tolist())}
        self.is_host = np.asarray([self.dev_roles[d] == "host" for d in self.dev.tolist()], dtype=bool)

    @property
    def P(self) -> int:
        return len(self.port_ids)

    @property
    def L(self) -> int:
        return int(self.lane_off[-1])

    def lane_index(self, port: np.ndarray, lane: np.ndarray) -> np.ndarray:
        """Packed lane index, -1 for lanes the module does not have."""
        ok = (lane >= 0) & (lane < self.n_lanes[port])
        return np.where(ok, self.lane_off[port] + lane, -1)

    def port_label(self, p: int) -> str:
        return f"{self.dev_names[self.dev[p]]}:{self.port_names[p]}"


def thresholds_arrays(rows: list[dict[str, Any] | None]) -> dict[str, np.ndarray]:
    """Module thresholds (schemas.Thresholds dicts) as arrays keyed like 'rx_lw'."""
    out = {f"{short}_{lv}": np.full(len(rows), np.nan) for _, short in _TH_KEYS for _, lv in _TH_LEVELS}
    for i, th in enumerate(rows):
        for key, short in _TH_KEYS:
            q = (th or {}).get(key) or {}
            for level, lv in _TH_LEVELS:
                v = q.get(level)
                if isinstance(v, int | float):
                    out[f"{short}_{lv}"][i] = float(v)
    return out


def fec_limit_for(optic_type: str | None, speed_gbps: float | None) -> float:
    """KP4 limit for PAM4 (50G+/lane), KR4 for NRZ 100G-and-below modules."""
    t = (optic_type or "").upper()
    if t.startswith(("100G", "40G", "25G", "10G")) or (speed_gbps is not None and speed_gbps <= 100):
        return NRZ_FEC_LIMIT
    return PAM4_FEC_LIMIT


# --- tracks -----------------------------------------------------------------------------


class GaugeTrack:
    """Last value and the current cycle window's sum/count/min/max per entity."""

    FIELDS = ("last", "last_ts", "w_sum", "w_n", "w_min", "w_max")

    def __init__(self, n: int) -> None:
        self.last = np.full(n, np.nan)
        self.last_ts = np.zeros(n, np.int64)
        self.w_sum = np.zeros(n)
        self.w_n = np.zeros(n, np.int32)
        self.w_min = np.full(n, np.inf)
        self.w_max = np.full(n, -np.inf)

    def put(self, idx: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        ok = np.isfinite(val)  # NaN/inf readings are missing data, not values
        idx, ts, val = idx[ok], ts[ok], val[ok]
        self.last[idx], self.last_ts[idx] = val, ts
        self.w_sum[idx] += val
        self.w_n[idx] += 1
        self.w_min[idx] = np.minimum(self.w_min[idx], val)
        self.w_max[idx] = np.maximum(self.w_max[idx], val)

    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.w_n > 0, self.w_sum / np.maximum(self.w_n, 1), np.nan)

    def roll(self) -> None:
        self.w_sum[:] = 0
        self.w_n[:] = 0
        self.w_min[:] = np.inf
        self.w_max[:] = -np.inf


class CounterTrack:
    """Last raw reading per entity and the window's known increase, covered time and peak step."""

    FIELDS = ("last", "last_ts", "bits", "sat", "acc", "acc_ms", "peak", "peak_ms", "unknown")

    def __init__(self, n: int) -> None:
        self.last = np.full(n, np.nan)
        self.last_ts = np.zeros(n, np.int64)
        self.bits = np.zeros(n, np.int16)       # 0: width unknown (64-bit native)
        self.sat = np.zeros(n, bool)
        self.acc = np.zeros(n)
        self.acc_ms = np.zeros(n, np.int64)
        self.peak = np.zeros(n)                 # the largest single-step increase in the window
        self.peak_ms = np.zeros(n, np.int64)    # ...and that step's length
        self.unknown = np.zeros(n, np.int32)    # steps whose increase could not be known

    def put(self, idx: np.ndarray, ts: np.ndarray, val: np.ndarray, max_gap_ms: int) -> None:
        val = np.where(np.isfinite(val), val, np.nan)
        prev, prev_ts = self.last[idx], self.last_ts[idx]
        dt = ts - prev_ts
        inc = increases(prev, val, self.bits[idx], self.sat[idx])
        known = np.isfinite(inc) & (dt > 0) & (dt <= max_gap_ms)
        had_prev = np.isfinite(prev)
        self.unknown[idx] += (had_prev & ~known).astype(np.int32)
        k_idx, k_inc, k_dt = idx[known], inc[known], dt[known]
        self.acc[k_idx] += k_inc
        self.acc_ms[k_idx] += k_dt
        bigger = k_inc > self.peak[k_idx]
        self.peak[k_idx[bigger]] = k_inc[bigger]
        self.peak_ms[k_idx[bigger]] = k_dt[bigger]
        fin = np.isfinite(val)  # a NaN reading keeps the previous one as the reference
        self.last[idx[fin]], self.last_ts[idx[fin]] = val[fin], ts[fin]

    def rate(self) -> np.ndarray:
        """Known increase per second over the window; NaN where nothing is known."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.acc_ms > 0, self.acc * 1000.0 / np.maximum(self.acc_ms, 1), np.nan)

    def roll(self) -> None:
        self.acc[:] = 0
        self.acc_ms[:] = 0
        self.peak[:] = 0
        self.peak_ms[:] = 0
        self.unknown[:] = 0


def increases(prev: np.ndarray, cur: np.ndarray, bits: np.ndarray, sat: np.ndarray) -> np.ndarray:
    """counters.increase over arrays (NaN for None): vectorised common case, exact fallback."""
    with np.errstate(invalid="ignore"):
        mx = np.where(bits > 0, np.exp2(bits.astype(np.float64)) - 1, np.inf)
        fast = (cur >= prev) & ~(sat & (bits > 0) & (cur >= mx))
        out = np.where(fast, cur - prev, np.nan)
        slow = np.flatnonzero(~fast & np.isfinite(prev) & np.isfinite(cur))
    for j in slow.tolist():
        b = int(bits[j]) or None
        v = increase(float(prev[j]), float(cur[j]), bits=b, saturating=bool(sat[j]))
        out[j] = np.nan if v is None else v
    return out


class RobustBaseline:
    """Huber-clipped exponentially weighted location/scale: a bounded-memory robust baseline.

    A step away from the baseline moves it by at most alpha * 3 scale units per update, so a
    connector that went dirty stays visible for days; entities under an active finding are
    frozen (not updated), so a fault is never learned as normal. Warm-up uses alpha = 1/n.
    """

    FIELDS = ("loc", "scale", "n")

    def __init__(self, n: int, scale_floor: float) -> None:
        self.loc = np.full(n, np.nan)
        self.scale = np.full(n, scale_floor)
        self.n = np.zeros(n, np.int32)
        self.floor = scale_floor

    def update(self, x: np.ndarray, alpha: float, frozen: np.ndarray | None = None) -> None:
        ok = np.isfinite(x)
        if frozen is not None:
            ok &= ~frozen
        first = ok & ~np.isfinite(self.loc)
        self.loc[first] = x[first]
        self.n[first] = 1
        upd = ok & ~first
        if not upd.any():
            return
        n = self.n[upd] + 1
        a = np.maximum(1.0 / n, alpha)
        s = self.scale[upd]
        r = x[upd] - self.loc[upd]
        c = 3.0 * s
        self.loc[upd] += a * np.clip(r, -c, c)
        self.scale[upd] = np.maximum(s + a * (np.minimum(np.abs(r), c) - s), self.floor)
        self.n[upd] = np.minimum(n, 1 << 30)


class TrendBuffer:
    """Downsampled ring of bucket means per entity (float32), for robust slopes over days."""

    FIELDS = ("buf", "t", "b_sum", "b_n", "count")

    def __init__(self, n: int, points: int) -> None:
        self.buf = np.full((n, points), np.nan, np.float32)
        self.t = np.full(points, -1, np.int64)     # bucket end times (data time), shared by all entities
        self.b_sum = np.zeros(n)
        self.b_n = np.zeros(n, np.int32)
        self.count = np.zeros(1, np.int64)

    def add(self, x: np.ndarray) -> None:
        ok = np.isfinite(x)
        self.b_sum[ok] += x[ok]
        self.b_n[ok] += 1

    def close(self, t_ms: int) -> None:
        k = int(self.count[0]) % self.buf.shape[1]
        with np.errstate(invalid="ignore", divide="ignore"):
            self.buf[:, k] = np.where(self.b_n > 0, self.b_sum / np.maximum(self.b_n, 1), np.nan)
        self.t[k] = t_ms
        self.count[0] += 1
        self.b_sum[:] = 0
        self.b_n[:] = 0

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """(times (K,), values (n, K)) oldest first, only filled buckets."""
        n, k = self.buf.shape[1], int(self.count[0])
        if k <= n:
            return self.t[:k], self.buf[:, :k]
        order = (np.arange(n) + k) % n
        return self.t[order], self.buf[:, order]


# --- the state -------------------------------------------------------------------------


@dataclass
class Config:
    """Tunables; docs/detection.md gives each one's source."""

    lateness_ms: int = 30_000             # samples may arrive this late; a cycle at T reads ts <= T - lateness
    initial_lookback_ms: int = 300_000    # a fresh state starts reading this far before its first cycle
    max_gap_ms: int = 900_000             # a counter step longer than this is unknown (counters.rates)
    baseline_tau_ms: int = 7 * 86_400_000  # robust baseline time constant
    trend_bucket_ms: int = 2 * 3_600_000
    trend_points: int = 36                # 72 h of 2 h buckets
    trend_min_points: int = 12            # 24 h: a whole diurnal temperature cycle
    trend_recent_points: int = 18         # slopes use the newest 36 h: the current rate, not the window's average
    trend_min_drop_db: float = 0.5        # and the level already this far below its own baseline
    decay_half_life_ms: int = 3_600_000   # flap/burst penalty half-life (loose-module memory)
    # layer 0
    flap_storm_count: int = 5             # >= 5 flaps ...
    flap_storm_window_s: float = 75.0     # ... within one counter step this short: F31 says 10 s, which needs
    #                                       10 s polling; 75 s is one 60 s SNMP poll plus jitter
    loose_hold_penalty: float = 1.5       # a loose-module finding stays while its decayed penalty is this high
    post_fec_burst: float = 100.0         # post-FEC errors in one cycle that fire without a second interval
    link_down_hold_ms: int = 120_000      # oper-down (admin up at both ends) this long without an up reading: a
    #                                       down link; a flap or a link retraining recovers well within it
    pause_storm_duty: float = 0.9         # tx pause duty (F24/F25 use 0.99 per 100-200 ms; 0.9 per poll)
    pause_storm_rx_util: float = 0.05
    rx_drop_db: float = 1.5               # rx below its own baseline by this much = degraded
    tx_drop_db: float = 1.0               # peer tx below its baseline by this much = transmitter fault
    bias_drift_frac: float = 0.15
    bias_slope_frac_per_day: float = 0.015
    ber_margin_dec: float = 1.0           # pre-FEC BER within 1 decade of the FEC limit
    ber_jump_dec: float = 1.5             # pre-FEC BER above its own baseline by this many decades
    wobble_db: float = 0.25               # EW mean |successive rx difference| on the degraded lanes
    trend_slope_db_per_day: float = 0.1
    ttt_warn_hours: float = 14 * 24.0
    shared_frac: float = 0.3
    shared_min_ports: int = 3
    congestion_ecn_frac: float = 0.06       # of rx packets; background incast bursts reach ~0.04
    congestion_pause_duty: float = 0.03
    # layer 2
    if_trees: int = 100
    if_max_samples: int = 256
    if_quantile: float = 0.999
    if_min_rows: int = 400
    if_retrain_ms: int = 86_400_000
    if_min_history_ms: int = 86_400_000   # first training only after a day of data (a diurnal cycle)
    if_reservoir: int = 4096              # rows kept per cohort for (re)training
    if_rows_per_cycle: int = 64


KINDS = ("optical_degradation", "post_fec_errors", "flap_storm", "loose_module", "pause_storm", "host_side",
         "congestion", "ber_degradation", "dom_threshold", "bias_drift", "anomaly", "link_down")


class FeatureState:
    """All rolling state of a detector, over one Fabric."""

    def __init__(self, fabric: Fabric, config: Config | None = None) -> None:
        self.fabric = fabric
        self.cfg = config or Config()
        P, L = fabric.P, fabric.L
        self.gauges: dict[str, GaugeTrack] = {}
        self.counters: dict[str, CounterTrack] = {}
        for m, axis in AXIS.items():
            n = {"port": P, "lane": L, "prio": P * NPRIO}[axis]
            if catalogue.is_counter(m):
                self.counters[m] = CounterTrack(n)
            else:
                self.gauges[m] = GaugeTrack(n)
        self.rx_jitter = np.full(L, np.nan)           # EW mean |successive rx difference|
        self.base = {"rx": RobustBaseline(L, 0.1), "tx": RobustBaseline(L, 0.05),
                     "bias": RobustBaseline(L, 1e-4), "logber": RobustBaseline(P, 0.1),
                     "temp": RobustBaseline(P, 0.5)}
        self.trend = {"rx": TrendBuffer(L, self.cfg.trend_points), "bias": TrendBuffer(L, self.cfg.trend_points),
                      "temp": TrendBuffer(P, self.cfg.trend_points)}
        self.penalty = {"flap": np.zeros(P), "recovery": np.zeros(P), "burst": np.zeros(P), "burst_on": np.zeros(P)}
        self.hist = {k: np.zeros(P, np.uint32) for k in KINDS}   # bit i = condition held i cycles ago
        self.latched = {k: np.zeros(P, bool) for k in KINDS}
        self.flagged = np.zeros(P, bool)               # any finding last cycle: freeze baselines, skip training
        # data time of the first oper-down reading of a port's current run of down readings, with both ends
        # admin up when it started; 0: up, unknown, or down only because an end is admin-down
        self.down_since = np.zeros(P, np.int64)
        # layer-1 results, refreshed at each trend bucket close and kept until the next
        self.lane_trend = {k: np.full(L, np.nan) for k in ("rx_slope", "rx_level", "ttt_warn", "ttt_alarm",
                                                            "bias_slope")}
        D = len(fabric.dev_names)
        self.dev_hist = np.zeros(D, np.uint32)
        self.dev_latched = np.zeros(D, bool)
        self.reservoir_x = np.zeros((0, 0))
        self.reservoir_c = np.zeros(0, np.int64)
        self.watermark_ms: int | None = None
        self.last_cycle_ms: int | None = None
        self.next_bucket_ms: int | None = None
        self.last_train_ms: int | None = None
        self.first_cycle_ms: int | None = None
        self.cycles = 0

    # -- feeding ---------------------------------------------------------------------------
    def observe(self, batch: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                meta: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> int:
        """Apply samples {metric: (entity index, ts_ms, value)}; returns the number applied.

        `meta` optionally gives counter widths per metric: (entity index, bits) and saturating flags
        are set from it before values are applied (series.counter_bits / series.saturating).
        """
        n = 0
        for metric, (idx, ts, val) in batch.items():
            idx = np.asarray(idx, np.int64)
            ts = np.asarray(ts, np.int64)
            val = np.asarray(val, np.float64)
            good = idx >= 0
            idx, ts, val = idx[good], ts[good], val[good]
            if not len(idx):
                continue
            if len(idx) > 1 and not (idx[1:] > idx[:-1]).all():  # fast path: one sample per entity, in order
                order = np.lexsort((ts, idx)) if (ts[1:] < ts[:-1]).any() else np.argsort(idx, kind="stable")
                idx, ts, val = idx[order], ts[order], val[order]
            dup = idx[1:] == idx[:-1]
            if not dup.any():
                self._put(metric, idx, ts, val)
                n += len(idx)
                continue
            start = np.r_[True, ~dup]
            first = np.maximum.accumulate(np.where(start, np.arange(len(idx)), 0))
            rank = np.arange(len(idx)) - first
            for r in range(int(rank.max()) + 1):
                sel = rank == r
                self._put(metric, idx[sel], ts[sel], val[sel])
            n += len(idx)
        return n

    def set_counter_meta(self, metric: str, idx: np.ndarray, bits: np.ndarray, sat: np.ndarray) -> None:
        ct = self.counters.get(metric)
        if ct is not None and len(idx):
            ct.bits[idx] = bits
            ct.sat[idx] = sat

    def _put(self, metric: str, idx: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        ct = self.counters.get(metric)
        if ct is not None:
            ct.put(idx, ts, val, self.cfg.max_gap_ms)
            return
        gt = self.gauges.get(metric)
        if gt is None:
            return
        if metric in ("port_oper_up", "port_admin_up"):
            self._track_down(metric, idx, ts, val)
        if metric == "optic_rx_power_dbm":  # wobble: EW mean of |successive differences| (fiber, F22)
            ok = np.isfinite(val)
            i2, v2 = idx[ok], val[ok]
            d = np.minimum(np.abs(v2 - gt.last[i2]), 1.0)  # a step is not a wobble: clip its one big jump
            j = self.rx_jitter[i2]
            fresh = ~np.isfinite(j) & np.isfinite(d)
            j = np.where(fresh, d, np.where(np.isfinite(d), j + 0.05 * (d - j), j))
            self.rx_jitter[i2] = j
        gt.put(idx, ts, val)

    def _track_down(self, metric: str, idx: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        """Keep `down_since`: an up reading ends a run; an admin-down end (here or at the peer) restarts it."""
        ok = np.isfinite(val)
        idx, ts, val = idx[ok], ts[ok], val[ok]
        peer = self.fabric.peer[idx]
        if metric == "port_admin_up":
            off = idx[val < 0.5]
            self.down_since[off] = 0
            self.down_since[peer[(val < 0.5) & (peer >= 0)]] = 0
            return
        admin = self.gauges["port_admin_up"].last
        peer_admin = np.where(peer >= 0, admin[np.maximum(peer, 0)], np.nan)
        since = self.down_since[idx]
        start = (val < 0.5) & (since == 0) & ~(admin[idx] < 0.5) & ~(peer_admin < 0.5)
        self.down_since[idx] = np.where(val >= 0.5, 0, np.where(start, ts, since))

    def roll(self) -> None:
        """Start a new cycle window."""
        for t in (*self.gauges.values(), *self.counters.values()):
            t.roll()

    # -- persistence -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {"port_ids": self.fabric.port_ids, "lane_off": self.fabric.lane_off,
                                         "rx_jitter": self.rx_jitter, "flagged": self.flagged,
                                         "down_since": self.down_since,
                                         "reservoir_x": self.reservoir_x, "reservoir_c": self.reservoir_c}
        for m, t in self.gauges.items():
            for f in GaugeTrack.FIELDS:
                arrays[f"g|{m}|{f}"] = getattr(t, f)
        for m, t in self.counters.items():
            for f in CounterTrack.FIELDS:
                arrays[f"c|{m}|{f}"] = getattr(t, f)
        for k, b in self.base.items():
            for f in RobustBaseline.FIELDS:
                arrays[f"b|{k}|{f}"] = getattr(b, f)
        for k, tb in self.trend.items():
            for f in TrendBuffer.FIELDS:
                arrays[f"t|{k}|{f}"] = getattr(tb, f)
        for k, v in self.penalty.items():
            arrays[f"p|{k}"] = v
        for k in KINDS:
            arrays[f"h|{k}"], arrays[f"l|{k}"] = self.hist[k], self.latched[k]
        for k, v in self.lane_trend.items():
            arrays[f"lt|{k}"] = v
        arrays["dev_names"] = np.asarray(self.fabric.dev_names, dtype=str)
        arrays["dev_hist"], arrays["dev_latched"] = self.dev_hist, self.dev_latched
        meta = {"watermark_ms": self.watermark_ms, "last_cycle_ms": self.last_cycle_ms,
                "next_bucket_ms": self.next_bucket_ms, "last_train_ms": self.last_train_ms, "cycles": self.cycles,
                "first_cycle_ms": self.first_cycle_ms}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, fabric: Fabric, config: Config | None = None) -> FeatureState:
        """Restore a state; ports are matched by id, so inventory changes keep what still exists."""
        st = cls(fabric, config)
        z = np.load(io.BytesIO(data), allow_pickle=False)
        old_ids = z["port_ids"]
        old_off = z["lane_off"]
        pmap = np.asarray([fabric.port_index.get(int(p), -1) for p in old_ids.tolist()], np.int64)
        same = len(old_ids) == fabric.P and bool((pmap == np.arange(fabric.P)).all()) and \
            np.array_equal(old_off, fabric.lane_off)
        # old lane/prio index -> new index (-1: gone); only lanes both layouts have are kept
        old_lane_port = np.repeat(np.arange(len(old_ids)), np.diff(old_off))
        old_lane_no = np.arange(int(old_off[-1])) - old_off[old_lane_port]
        newp = pmap[old_lane_port]
        lmap = np.where(newp >= 0, fabric.lane_index(np.maximum(newp, 0), old_lane_no), -1)
        qmap = np.repeat(pmap, NPRIO) * NPRIO + np.tile(np.arange(NPRIO), len(old_ids))
        qmap = np.where(np.repeat(pmap, NPRIO) >= 0, qmap, -1)

        def put(dst: np.ndarray, src: np.ndarray) -> None:
            if same:
                dst[...] = src
                return
            n_old = src.shape[0]
            mp = pmap if n_old == len(old_ids) else lmap if n_old == len(old_lane_port) else qmap
            ok = mp >= 0
            dst[mp[ok]] = src[ok]

        for m, t in st.gauges.items():
            for f in GaugeTrack.FIELDS:
                put(getattr(t, f), z[f"g|{m}|{f}"])
        for m, t in st.counters.items():
            for f in CounterTrack.FIELDS:
                put(getattr(t, f), z[f"c|{m}|{f}"])
        for k, b in st.base.items():
            for f in RobustBaseline.FIELDS:
                put(getattr(b, f), z[f"b|{k}|{f}"])
        for k, tb in st.trend.items():
            put(tb.buf, z[f"t|{k}|buf"]) if z[f"t|{k}|buf"].shape[1:] == tb.buf.shape[1:] else None
            put(tb.b_sum, z[f"t|{k}|b_sum"])
            put(tb.b_n, z[f"t|{k}|b_n"])
            if z[f"t|{k}|t"].shape == tb.t.shape:
                tb.t[:], tb.count[:] = z[f"t|{k}|t"], z[f"t|{k}|count"]
        put(st.rx_jitter, z["rx_jitter"])
        put(st.flagged, z["flagged"])
        if "down_since" in z:  # absent in states saved before link-down detection
            put(st.down_since, z["down_since"])
        for k in st.penalty:
            put(st.penalty[k], z[f"p|{k}"])
        for k in KINDS:
            if f"h|{k}" in z:
                put(st.hist[k], z[f"h|{k}"])
                put(st.latched[k], z[f"l|{k}"])
        for k in st.lane_trend:
            put(st.lane_trend[k], z[f"lt|{k}"])
        dpos = {n: i for i, n in enumerate(fabric.dev_names)}
        for i, name in enumerate(z["dev_names"].tolist()):
            j = dpos.get(name)
            if j is not None:
                st.dev_hist[j], st.dev_latched[j] = z["dev_hist"][i], z["dev_latched"][i]
        st.reservoir_x, st.reservoir_c = z["reservoir_x"], z["reservoir_c"]
        meta = json.loads(bytes(z["meta"]).decode())
        st.watermark_ms, st.last_cycle_ms = meta["watermark_ms"], meta["last_cycle_ms"]
        st.next_bucket_ms, st.last_train_ms, st.cycles = meta["next_bucket_ms"], meta["last_train_ms"], meta["cycles"]
        st.first_cycle_ms = meta.get("first_cycle_ms")
        return st
