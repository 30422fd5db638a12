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

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.detection import archive
from service.telemetry import catalogue
from service.telemetry.counters import increase

NPRIO = 8
_STORED_PLAIN = {"reservoir_x"}  # members of the saved archive stored uncompressed (FeatureState.to_bytes)
GAUGE_PORT = ("port_oper_up", "port_admin_up", "port_speed_bits_per_second", "optic_temperature_celsius",
              "optic_voltage_volts", "port_pre_fec_ber")
GAUGE_LANE = ("optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_pre_fec_ber")
GAUGE_GPU = ("gpu_pcie_link_width", "gpu_pcie_link_generation")
COUNTER_PORT = ("port_link_down_events_total", "port_carrier_changes_total", "port_link_error_recovery_total",
                "port_rx_bytes_total", "port_rx_packets_total", "port_rx_phy_bits_total",
                "port_fec_corrected_bits_total", "port_fec_uncorrectable_codewords_total", "port_symbol_errors_total",
                "port_rx_fcs_errors_total", "port_rx_errors_total", "port_ecn_marked_packets_total",
                "port_cnp_sent_total", "port_pause_storm_warning_events_total", "port_pause_storm_error_events_total",
                "port_tx_pause_seconds_total") + (
    # RoCE transport (RC) loss signals of a host NIC: evidence of what a link fault costs the RDMA traffic
    "port_local_ack_timeouts_total", "port_adaptive_retransmit_timeouts_total",  # timeouts
    "port_nak_sequence_errors_total", "port_implied_nak_sequence_errors_total", "port_duplicate_requests_total",
    "port_adaptive_retransmits_total",  # retransmits
    "port_icrc_errors_total")  # corrupted end to end
COUNTER_PRIO = ("port_pfc_tx_pause_seconds_total", "port_pfc_rx_pause_seconds_total")
# metric -> entity axis it is stored on
AXIS: dict[str, str] = {**{m: "port" for m in GAUGE_PORT + COUNTER_PORT}, **{m: "lane" for m in GAUGE_LANE},
                        **{m: "port" for m in GAUGE_GPU}, **{m: "prio" for m in COUNTER_PRIO}}
USED_METRICS = tuple(AXIS)
# gauges whose window minimum/maximum the rules read (the rest keep only the window mean: lanes are many). rx
# power's minimum says whether every reading of an observation was lit (rules: the light of a link that dropped)
GAUGE_MINMAX = ("port_oper_up", "port_admin_up", "port_pre_fec_ber", "optic_rx_power_dbm")
# counters whose rate is also tracked over sub-windows of Config.rate_window_ms (worst and best sub-window):
# a short storm or BER burst inside a long cycle is not averaged away, whatever the cycle step
COUNTER_SUB = ("port_pfc_tx_pause_seconds_total", "port_tx_pause_seconds_total", "port_rx_bytes_total",
               "port_fec_corrected_bits_total")
# counters whose rate is a level condition counted per observation window, not per cycle (BER: corrected bits;
# pause duty: tx pause seconds; the ECN share: ECN-marked packets)
COUNTER_LEVEL = ("port_fec_corrected_bits_total", "port_pfc_tx_pause_seconds_total", "port_tx_pause_seconds_total",
                 "port_ecn_marked_packets_total")
EPOCH_MS = 946_684_800_000  # 2000-01-01Z: observation times are stored as uint32 seconds since then

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

    def same_as(self, other: Fabric) -> bool:
        """Every given field equal (NaN equal to NaN): a state over one of them is a state over the other."""
        if self is other:
            return True
        for f in ("port_ids", "dev", "peer", "n_lanes", "speed_bps", "cohort", "fec_limit", "copper"):
            a, b = getattr(self, f), getattr(other, f)
            if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                return False
        if (self.port_names, self.dev_names, self.dev_roles, self.cohort_names, self.gpu_port) != \
                (other.port_names, other.dev_names, other.dev_roles, other.cohort_names, other.gpu_port):
            return False
        return self.th.keys() == other.th.keys() and all(
            self.th[k].shape == other.th[k].shape and np.array_equal(self.th[k], other.th[k], equal_nan=True)
            for k in self.th)


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
    """Per entity: the last reading, the current cycle window (readings since the previous cycle) and the held
    observation (the newest window that had readings).

    A cycle that brings no reading of an entity keeps its held observation: the rules then see the metric as it
    was, not as missing. A reading not newer than the last one (a duplicate, or a late sample overtaken by a newer
    one) is ignored. A held observation older than Config.stale_ms is dropped (NaN).
    """

    def __init__(self, n: int, minmax: bool = False) -> None:
        self.minmax = minmax
        self.last = np.full(n, np.nan)
        self.last_ts = np.zeros(n, np.int64)
        self.w_sum = np.zeros(n)
        self.w_n = np.zeros(n, np.int32)
        self.h_mean = np.full(n, np.nan)
        self.h_ts = np.zeros(n, np.int64)       # data time of the held observation's newest reading; 0: none
        if minmax:
            self.w_min = np.full(n, np.inf)
            self.w_max = np.full(n, -np.inf)
            self.h_min = np.full(n, np.nan)
            self.h_max = np.full(n, np.nan)

    @property
    def FIELDS(self) -> tuple[str, ...]:  # the saved arrays, as for the other tracks
        base = ("last", "last_ts", "w_sum", "w_n", "h_mean", "h_ts")
        return base + ("w_min", "w_max", "h_min", "h_max") if self.minmax else base

    def newer(self, idx: np.ndarray, ts: np.ndarray) -> np.ndarray:
        return ts > self.last_ts[idx]

    def put(self, idx: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        ok = np.isfinite(val) & self.newer(idx, ts)  # NaN/inf readings are missing data, not values
        idx, ts, val = idx[ok], ts[ok], val[ok]
        self.last[idx], self.last_ts[idx] = val, ts
        self.w_sum[idx] += val
        self.w_n[idx] += 1
        if self.minmax:
            self.w_min[idx] = np.minimum(self.w_min[idx], val)
            self.w_max[idx] = np.maximum(self.w_max[idx], val)

    def settle(self, at_ms: int, stale_ms: int) -> np.ndarray:
        """Move this cycle's window into the held observation; returns where it was new (fresh)."""
        fresh = self.w_n > 0
        if fresh.any():  # most replay cycles bring no reading of a metric: nothing to move
            with np.errstate(invalid="ignore", divide="ignore"):
                self.h_mean[fresh] = self.w_sum[fresh] / self.w_n[fresh]
            self.h_ts[fresh] = self.last_ts[fresh]
            if self.minmax:
                self.h_min[fresh], self.h_max[fresh] = self.w_min[fresh], self.w_max[fresh]
        stale = (self.h_ts > 0) & (self.h_ts < at_ms - stale_ms)  # at - h_ts > stale_ms, one array op fewer
        if stale.any():
            self.h_mean[stale] = np.nan
            if self.minmax:
                self.h_min[stale] = self.h_max[stale] = np.nan
        return fresh

    def roll(self) -> None:
        if not self.w_n.any():  # no reading this cycle: the window is as a roll leaves it (put moves all together)
            return
        self.w_sum[:] = 0
        self.w_n[:] = 0
        if self.minmax:
            self.w_min[:] = np.inf
            self.w_max[:] = -np.inf


class CounterTrack:
    """Per entity: the last raw reading, this cycle's known increase and covered time, and the held observation
    (the newest cycle window with a known step). With `sub_ms`, also the rate over sub-windows of at least that
    much data time: the worst (`pk`) and best (`lo`) sub-window of the cycle, so that a short burst inside a long
    window is seen at the same strength whatever the poll and cycle steps."""

    BASE = ("last", "last_ts", "bits", "sat", "acc", "acc_ms", "acc_n", "acc_nz", "unknown", "h_acc", "h_ms",
            "h_ts")
    SUB = ("s_acc", "s_ms", "pk", "lo", "h_pk", "h_lo")
    LEVEL = ("o_acc", "o_ms", "thr")  # saved: the running window and its threshold (o_n, o_hit, o_top: per cycle)

    def __init__(self, n: int, sub_ms: int = 0, level_ms: int = 0) -> None:
        self.sub_ms = sub_ms
        self.level_ms = level_ms
        self.level = level_ms > 0
        if self.level:
            # a rate level's observations (BER, pause duty, ECN share): windows of about level_ms of data (a poll,
            # or polls shorter than it merged; closed at 90 % of it, so a 60 s poll with jitter is one), counted
            # per cycle (o_n), with those whose rate reached `thr` (o_hit; per second, NaN: none set) and the
            # largest HIST window rates of the cycle (o_top, per second; -inf: none), for conditions whose rate
            # threshold is only known at the cycle (a share of another counter). The window spans cycles, so a
            # cycle step longer than the poll brings one observation per poll, as a 60 s step does one by one
            self.o_acc = np.zeros(n)
            self.o_ms = np.zeros(n, np.int64)
            self.o_n = np.zeros(n, np.int32)
            self.o_hit = np.zeros(n, np.int32)
            self.thr = np.full(n, np.nan)
            self.o_top = np.full((n, HIST), -np.inf, np.float32)  # this cycle's only (reset by roll)
        self.last = np.full(n, np.nan)
        self.last_ts = np.zeros(n, np.int64)
        self.bits = np.zeros(n, np.int16)       # 0: width unknown (64-bit native)
        self.sat = np.zeros(n, bool)
        self.acc = np.zeros(n)
        self.acc_ms = np.zeros(n, np.int64)
        self.acc_n = np.zeros(n, np.int32)      # known steps (polls) this cycle
        self.acc_nz = np.zeros(n, np.int32)     # ... of which with an increase
        self.unknown = np.zeros(n, np.int32)    # steps whose increase could not be known
        self.h_acc = np.full(n, np.nan)
        self.h_ms = np.zeros(n, np.int64)
        self.h_ts = np.zeros(n, np.int64)
        if sub_ms:
            self.s_acc = np.zeros(n)            # the running sub-window (spans cycles)
            self.s_ms = np.zeros(n, np.int64)
            self.pk = np.full(n, -np.inf)       # per second, this cycle's closed sub-windows
            self.lo = np.full(n, np.inf)
            self.h_pk = np.full(n, np.nan)
            self.h_lo = np.full(n, np.nan)

    @property
    def FIELDS(self) -> tuple[str, ...]:
        return self.BASE + (self.SUB if self.sub_ms else ()) + (self.LEVEL if self.level else ())

    def put(self, idx: np.ndarray, ts: np.ndarray, val: np.ndarray, max_gap_ms: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Apply readings; returns the known steps (entity, end time, increase, length) for event consumers."""
        fin = np.isfinite(val)
        newer = ts > self.last_ts[idx]  # a duplicate or a late, overtaken reading changes nothing
        if not newer.all():
            idx, ts, val, fin = idx[newer], ts[newer], val[newer], fin[newer]
        if not fin.all():
            val = np.where(fin, val, np.nan)
        prev, dt = self.last[idx], ts - self.last_ts[idx]
        inc = increases(prev, val, self.bits[idx], self.sat[idx])
        known = np.isfinite(inc) & (dt <= max_gap_ms)  # dt > 0: only newer readings are here
        all_known = bool(known.all())
        if not all_known:
            lost = idx[~known & np.isfinite(prev)]
            self.unknown[lost] += 1
            if self.sub_ms:  # an unknown step breaks the running sub-window
                self.s_acc[lost], self.s_ms[lost] = 0.0, 0
            if self.level:
                self.o_acc[lost], self.o_ms[lost] = 0.0, 0
        k_idx, k_inc, k_dt, k_ts = (idx, inc, dt, ts) if all_known else (idx[known], inc[known], dt[known],
                                                                          ts[known])
        self.acc[k_idx] += k_inc
        self.acc_ms[k_idx] += k_dt
        self.acc_n[k_idx] += 1
        self.acc_nz[k_idx] += (k_inc > 0).astype(np.int32)
        if self.sub_ms:
            self.s_acc[k_idx] += k_inc
            self.s_ms[k_idx] += k_dt
            done = k_idx[self.s_ms[k_idx] >= self.sub_ms]
            if len(done):
                rate = self.s_acc[done] * 1000.0 / self.s_ms[done]
                self.pk[done] = np.maximum(self.pk[done], rate)
                self.lo[done] = np.minimum(self.lo[done], rate)
                self.s_acc[done], self.s_ms[done] = 0.0, 0
        if self.level:
            self.o_acc[k_idx] += k_inc
            self.o_ms[k_idx] += k_dt
            done = k_idx[self.o_ms[k_idx] * 10 >= self.level_ms * 9]
            if len(done):
                rate = self.o_acc[done] * 1000.0 / self.o_ms[done]
                self.o_n[done] += 1
                self.o_hit[done] += ((rate >= self.thr[done]) & (rate > 0)).astype(np.int32)  # NaN: never
                top = self.o_top[done]  # keep the HIST largest: persistence counts at most HIST per cycle
                j = top.argmin(axis=1)
                rows = np.arange(len(done))
                top[rows, j] = np.maximum(top[rows, j], rate)
                self.o_top[done] = top
                self.o_acc[done], self.o_ms[done] = 0.0, 0
        if fin.all():  # a NaN reading keeps the previous one as the reference
            self.last[idx], self.last_ts[idx] = val, ts
        else:
            self.last[idx[fin]], self.last_ts[idx[fin]] = val[fin], ts[fin]
        return k_idx, k_ts, k_inc, k_dt

    def settle(self, at_ms: int, stale_ms: int) -> np.ndarray:
        """Move this cycle's known increase into the held observation; returns where it was new (fresh)."""
        fresh = self.acc_ms > 0
        if fresh.any():  # most replay cycles bring no step of a counter: nothing to move
            self.h_acc[fresh], self.h_ms[fresh], self.h_ts[fresh] = self.acc[fresh], self.acc_ms[fresh], \
                self.last_ts[fresh]
            if self.sub_ms:
                with np.errstate(invalid="ignore", divide="ignore"):
                    rate = self.acc * 1000.0 / np.maximum(self.acc_ms, 1)
                # no sub-window closed this cycle (cycles shorter than a sub-window): the cycle's own rate
                self.h_pk[fresh] = np.where(np.isfinite(self.pk), self.pk, rate)[fresh]
                self.h_lo[fresh] = np.where(np.isfinite(self.lo), self.lo, rate)[fresh]
        stale = (self.h_ts > 0) & (self.h_ts < at_ms - stale_ms)  # at - h_ts > stale_ms, one array op fewer
        if stale.any():
            self.h_acc[stale] = np.nan
            self.h_ms[stale] = 0
            if self.sub_ms:
                self.h_pk[stale] = self.h_lo[stale] = np.nan
        return fresh

    def rate(self) -> np.ndarray:
        """Known increase per second over the held observation; NaN where nothing is known."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.h_ms > 0, self.h_acc * 1000.0 / np.maximum(self.h_ms, 1), np.nan)

    def held(self) -> np.ndarray:
        """The held observation's increase; NaN where none."""
        return np.where(self.h_ms > 0, self.h_acc, np.nan)

    def windows_at(self, thr: np.ndarray | float) -> np.ndarray:
        """How many of this cycle's level windows reached `thr` (per second, per entity or one for all; NaN:
        none), at most HIST (the largest window rates are kept)."""
        with np.errstate(invalid="ignore"):
            t = np.broadcast_to(np.asarray(thr, float), self.o_n.shape)[:, None]
            return ((self.o_top >= t) & (self.o_top > 0)).sum(axis=1).astype(np.int64)

    def seen(self) -> np.ndarray:
        """Entities that have reported this counter at all."""
        return self.last_ts > 0

    def roll(self) -> None:
        if not self.acc_n.any():  # no known step this cycle: the window is as a roll leaves it (put moves all
            return                # of it, sub-windows and levels included, only for known steps)
        self.acc[:] = 0
        self.acc_ms[:] = 0
        self.acc_n[:] = 0
        self.acc_nz[:] = 0
        if self.sub_ms:
            self.pk[:] = -np.inf
            self.lo[:] = np.inf
        if self.level:
            self.o_n[:] = 0
            self.o_hit[:] = 0
            self.o_top[:] = -np.inf


class DecayedCount:
    """Exponentially decayed event counts per entity, kept in data time: an event adds at its own sample time,
    and the value read at any later time is decayed to it. So the count does not depend on how often it is read
    (cycles) or how events were batched into polls."""

    FIELDS = ("v", "t")

    def __init__(self, n: int, half_life_ms: int, cap: float = 10.0) -> None:
        self.v = np.zeros(n)
        self.t = np.zeros(n, np.int64)
        self.hl, self.cap = half_life_ms, cap

    def add(self, idx: np.ndarray, ts: np.ndarray, n: np.ndarray) -> None:
        """`n[i]` events at `ts[i]`; callers pass only entities with events (a few per poll), in time order."""
        for i, t, k in zip(idx.tolist(), ts.tolist(), np.asarray(n, float).tolist(), strict=True):
            dt = max(t - int(self.t[i]), 0)
            self.v[i] = min(self.v[i] * 0.5 ** (dt / self.hl) + k, self.cap)
            self.t[i] = max(t, int(self.t[i]))

    def value(self, at_ms: int | np.ndarray) -> np.ndarray:
        """The counts decayed to `at_ms` (a time, or one per entity)."""
        return self.v * 0.5 ** (np.maximum(np.asarray(at_ms) - self.t, 0) / self.hl)


class EventRing:
    """The data times of each entity's newest `size` events (0: none), oldest first: 'n events within W' is
    'the n-th newest event is within W', exact whatever the poll step that reported them."""

    FIELDS = ("t",)

    def __init__(self, n: int, size: int) -> None:
        self.t = np.zeros((n, size), np.int64)

    def add(self, idx: np.ndarray, ts: np.ndarray, n: np.ndarray) -> None:
        """`n[i]` events at `ts[i]` (a poll step's increase, stamped at its end)."""
        size = self.t.shape[1]
        k = np.minimum(np.floor(np.asarray(n, float) + 1e-9), size).astype(np.int64)
        for i, t, c in zip(idx.tolist(), ts.tolist(), k.tolist(), strict=True):
            if c > 0:
                row = self.t[i]
                row[:size - c] = row[c:].copy()
                row[size - c:] = t

    def count_since(self, since_ms: np.ndarray | int) -> np.ndarray:
        """Events at or after `since_ms` (capped at the ring size)."""
        return ((self.t >= np.asarray(since_ms).reshape(-1, 1)) & (self.t > 0)).sum(axis=1)

    def nth_newest(self, n: int) -> np.ndarray:
        """Data time of each entity's n-th newest event (0: fewer than n)."""
        return self.t[:, self.t.shape[1] - n] if 0 < n <= self.t.shape[1] else np.zeros(len(self.t), np.int64)


def increases(prev: np.ndarray, cur: np.ndarray, bits: np.ndarray, sat: np.ndarray) -> np.ndarray:
    """counters.increase over arrays (NaN for None): vectorised common case, exact fallback."""
    with np.errstate(invalid="ignore"):
        d = cur - prev
        fast = d >= 0  # NaN on either side: neither fast nor slow
        if sat.any():
            mx = np.where(bits > 0, np.exp2(bits.astype(np.float64)) - 1, np.inf)
            fast &= ~(sat & (bits > 0) & (cur >= mx))
        out = np.where(fast, d, np.nan)
        slow = ~fast & np.isfinite(prev) & np.isfinite(cur)
    if slow.any():
        for j in np.flatnonzero(slow).tolist():
            b = int(bits[j]) or None
            v = increase(float(prev[j]), float(cur[j]), bits=b, saturating=bool(sat[j]))
            out[j] = np.nan if v is None else v
    return out


class RobustBaseline:
    """Huber-clipped exponentially weighted location/scale: a bounded-memory robust baseline.

    Updated once per observation (a cycle that brought the entity new readings), weighted by the data time since
    its previous observation (alpha = elapsed / tau), so the same history gives the same baseline whatever the
    poll and cycle steps. A step away from the baseline moves it by at most alpha * 3 scale units, so a connector
    that went dirty stays visible for days; entities under an active finding are frozen (their observations are
    skipped, and the skipped time is not learned later), so a fault is never learned as normal. Warm-up uses
    alpha = 1/n, n the observations so far.
    """

    FIELDS = ("loc", "scale", "n", "t")

    def __init__(self, n: int, scale_floor: float) -> None:
        self.loc = np.full(n, np.nan)
        self.scale = np.full(n, scale_floor)
        self.n = np.zeros(n, np.int32)
        self.t = np.zeros(n, np.int64)  # data time of the last observation (learned or skipped)
        self.floor = scale_floor

    def update(self, x: np.ndarray, at_ms: int, tau_ms: int, fresh: np.ndarray | None = None,
               frozen: np.ndarray | None = None) -> None:
        ok = np.isfinite(x)
        if fresh is not None:
            ok &= fresh
        if frozen is not None:
            self.t[ok & frozen] = at_ms
            ok &= ~frozen
        first = ok & ~np.isfinite(self.loc)
        self.loc[first] = x[first]
        self.n[first] = 1
        self.t[first] = at_ms
        upd = ok & ~first
        if not upd.any():
            return
        n = self.n[upd] + 1
        alpha = np.clip((at_ms - self.t[upd]) / tau_ms, 0.0, 1.0)
        a = np.maximum(1.0 / n, alpha)
        s = self.scale[upd]
        r = x[upd] - self.loc[upd]
        c = 3.0 * s
        self.loc[upd] += a * np.clip(r, -c, c)
        self.scale[upd] = np.maximum(s + a * (np.minimum(np.abs(r), c) - s), self.floor)
        self.n[upd] = np.minimum(n, 1 << 30)
        self.t[upd] = at_ms


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
    max_gap_ms: int = 1_860_000           # a counter step longer than this is unknown (counters.rates): two
    #                                       15 min polls and a minute of slack, so coarse history still counts
    stale_ms: int = 2_100_000             # a metric's held observation is dropped when this old (35 min: a 15 min
    #                                       poll that missed once is still held)
    persist_window_ms: int = 7_200_000    # persistence: k of the last n observations within this data time
    rate_window_ms: int = 60_000          # rates (pause duty, BER bursts) are also taken per sub-window this long
    baseline_tau_ms: int = 7 * 86_400_000  # robust baseline time constant
    trend_bucket_ms: int = 2 * 3_600_000
    trend_points: int = 36                # 72 h of 2 h buckets
    trend_min_points: int = 12            # 24 h: a whole diurnal temperature cycle
    trend_recent_points: int = 18         # slopes use the newest 36 h: the current rate, not the window's average
    trend_min_drop_db: float = 0.5        # and the level already this far below its own baseline
    trend_fallback_warn_db: float = 3.0   # no module low-warning: a trend's time to threshold is to baseline - 3 dB
    decay_half_life_ms: int = 3_600_000   # flap/recovery/burst penalty half-life (loose-module memory)
    burst_quiet_ms: int = 300_000         # errors after this long without any start a new burst (an onset)
    # layer 0
    flap_storm_count: int = 5             # >= 5 flaps ...
    flap_storm_window_s: float = 1800.0   # ... within 30 min of data time, however the polls split them (F31's
    #                                       5 in 10 s needs 10 s polling; SNMP and imports step 1-15 min)
    loose_hold_penalty: float = 1.5       # a loose-module finding stays while its decayed penalty is this high
    post_fec_burst: float = 100.0         # post-FEC errors in one observation that fire without a second one
    link_down_hold_ms: int = 120_000      # oper-down (admin up at both ends) this long without an up reading: a
    #                                       down link; a flap or a link retraining recovers well within it
    lit_dbm: float = -20.0                # a lane reading above this is lit (LOS asserts at -15 to -30 dBm, F5)
    pause_storm_duty: float = 0.9         # tx pause duty (F24/F25 use 0.99 per 100-200 ms; 0.9 per poll)
    pause_storm_rx_util: float = 0.05
    pause_storm_rx_floor_bps: float = 1e9  # no line rate known: "draining nothing" is rx below 1 Gb/s
    rx_drop_db: float = 1.5               # rx below its own baseline by this much = degraded
    tx_drop_db: float = 1.0               # peer tx below its baseline by this much = transmitter fault
    bias_drift_frac: float = 0.15
    bias_slope_frac_per_day: float = 0.015
    ber_margin_dec: float = 1.0           # pre-FEC BER within 1 decade of the FEC limit
    ber_jump_dec: float = 1.5             # pre-FEC BER above its own baseline by this many decades
    wobble_db: float = 0.25               # mean |successive rx difference| on the degraded lanes since the drop
    wobble_min_readings: int = 3          # ... over this many differences since the drop (fewer: called stable)
    trend_slope_db_per_day: float = 0.1
    ttt_warn_hours: float = 14 * 24.0
    shared_frac: float = 0.3
    shared_min_ports: int = 3
    congestion_ecn_frac: float = 0.06       # of rx packets; background incast bursts reach ~0.04
    congestion_pause_duty: float = 0.03
    # layer 2
    if_trees: int = 100
    if_max_samples: int = 256
    if_tail_p: float = 1e-4               # false-alarm budget: P(a healthy observation scores above the threshold)
    if_tail_from: float = 0.99            # held-out quantile where the extrapolated score tail begins
    if_min_rows: int = 400
    if_retrain_ms: int = 86_400_000
    if_min_history_ms: int = 86_400_000   # first training only after a day of data (a diurnal cycle)
    if_reservoir: int = 4096              # rows kept per cohort for (re)training
    if_window_ms: int = 2 * 86_400_000    # ... sampled evenly over this much data time (forest.reservoir_take)


# lane gauges whose dark readings (no light: a laser off, nothing received) only port state explains
DARK_METRICS = ("optic_rx_power_dbm", "optic_tx_power_dbm")
KINDS = ("optical_degradation", "post_fec_errors", "flap_storm", "loose_module", "pause_storm", "host_side",
         "congestion", "ber_degradation", "dom_threshold", "bias_drift", "anomaly", "link_down")
HIST = 5  # observations kept per condition and port (the largest n of the k-of-n persistence)

# Why a rule cannot run on a port (FeatureState.blocked codes; 0: it runs). docs/detection.md, "Inputs per rule".
BLOCKED = (
    "",
    "no port state (oper/admin) and no light or traffic: cannot tell whether the port is in service",
    "no optic_rx_power_dbm readings",
    "no optic_tx_bias_amperes readings",
    "no module DOM readings (temperature, voltage, tx bias, tx power)",
    "the module gives no alarm thresholds (optics.thresholds)",
    "no post-FEC counter (uncorrectable codewords, symbol errors, FCS/CRC or rx errors)",
    "no pre-FEC BER (corrected bits with rx phy bits, port_pre_fec_ber or optic_pre_fec_ber)",
    "no link-down counter, carrier changes or oper-status readings",
    "no link recoveries, flaps, pre-FEC BER or post-FEC counters",
    "no PFC or global pause counters and no pause-storm counters",
    "no PCIe link width/generation of this NIC's GPU",
    "no ECN-marked packets and no pause counters",
    "no port_oper_up readings",
    "not linked in the inventory (no far end)",
)
# How a rule runs on less than its full inputs (FeatureState.degraded bits; bit i is DEGRADED[i]).
DEGRADED = (
    "port_admin_up absent: in service when oper-up",
    "port_admin_up and port_oper_up absent: in service when a lane is lit or traffic flows",
    "module thresholds absent: rx against its own baseline and trend only (no low-warning margin, no alarm page)",
    "line rate unknown (no speed, no rx phy bits): draining nothing means rx below an absolute floor",
    "port_admin_up absent: a port shut on purpose reads the same as a failed link",
    "no FEC counters: post-FEC errors from FCS/CRC (or rx) errors",
    "no link-down counter: flaps from carrier changes or oper-status transitions",
    "no corrected-bit counters: pre-FEC BER from the device's own gauge",
)


class FeatureState:
    """All rolling state of a detector, over one Fabric."""

    def __init__(self, fabric: Fabric, config: Config | None = None) -> None:
        self.fabric = fabric
        self.cfg = cfg = config or Config()
        P, L = fabric.P, fabric.L
        D = len(fabric.dev_names)
        self.gauges: dict[str, GaugeTrack] = {}
        self.counters: dict[str, CounterTrack] = {}
        for m, axis in AXIS.items():
            n = {"port": P, "lane": L, "prio": P * NPRIO}[axis]
            if catalogue.is_counter(m):
                self.counters[m] = CounterTrack(n, cfg.rate_window_ms if m in COUNTER_SUB else 0,
                                             cfg.rate_window_ms if m in COUNTER_LEVEL else 0)
            else:
                self.gauges[m] = GaugeTrack(n, m in GAUGE_MINMAX)
        self.fresh_m: dict[str, np.ndarray] = {m: np.zeros(0, bool) for m in AXIS}  # set by settle()
        self.polls_m: dict[str, np.ndarray] = {}   # readings (gauges) / known steps (counters) this cycle
        self.nz_m: dict[str, np.ndarray] = {}      # counters: steps with an increase this cycle
        self.rx_jitter = np.full(L, np.nan)           # mean |successive rx difference| (wobble)
        self.rx_jitter_n = np.zeros(L, np.int32)      # differences in it so far
        # the same since the port's optical condition began (reset then): the fiber-vs-contamination test
        # compares lanes over the same readings after the drop, whatever the optics poll
        self.wob_sum = np.zeros(L)
        self.wob_n = np.zeros(L, np.int32)
        # rx_jitter when it began: the reference of a port whose every lane degraded (no lane left to compare with)
        self.wob_ref = np.full(L, np.nan)
        self.base = {"rx": RobustBaseline(L, 0.1), "tx": RobustBaseline(L, 0.05),
                     "bias": RobustBaseline(L, 1e-4), "logber": RobustBaseline(P, 0.1),
                     "temp": RobustBaseline(P, 0.5)}
        self.trend = {"rx": TrendBuffer(L, cfg.trend_points), "bias": TrendBuffer(L, cfg.trend_points),
                      "temp": TrendBuffer(P, cfg.trend_points)}
        # loose-module memory: decayed counts of flaps, link recoveries and error-burst onsets, in data time
        self.pen = {k: DecayedCount(P, cfg.decay_half_life_ms) for k in ("flap", "recovery", "burst")}
        self.flaps = EventRing(P, max(16, cfg.flap_storm_count))   # data times of the newest flaps
        # data time of the newest observation with an error burst (a BER jump or post-FEC errors): errors after
        # Config.burst_quiet_ms without any are a new burst (an onset), errors that go on are the same one
        self.burst_ms = np.zeros(P, np.int64)
        # persistence per condition: the last HIST observations (held?, when), newest last
        self.obs_hit = {k: np.zeros((P, HIST), bool) for k in KINDS}
        self.obs_t = {k: np.zeros((P, HIST), np.uint32) for k in KINDS}
        self.latched = {k: np.zeros(P, bool) for k in KINDS}
        self.last_raw = {k: np.zeros(P, bool) for k in KINDS}
        self.onset = {k: np.zeros(P, np.int64) for k in KINDS}  # data time the condition first held (0: not)
        # inputs per rule and port: why it cannot run (BLOCKED code) and what it runs without (DEGRADED bits)
        self.blocked = {k: np.zeros(P, np.uint8) for k in KINDS}
        self.degraded = {k: np.zeros(P, np.uint16) for k in KINDS}
        self.flagged = np.zeros(P, bool)               # any finding last cycle: freeze baselines, skip training
        # data time of the first oper-down reading of a port's current run of down readings, with both ends
        # admin up (or admin unknown) when it started; 0: up, unknown, or down only because an end is admin-down
        self.down_since = np.zeros(P, np.int64)
        self.down_from_up = np.zeros(P, bool)          # that run began with an up -> down transition seen here
        self.oper_gap = np.zeros(P, np.int64)          # ms between oper readings (the larger of the newest and half
        #                                                the previous: an ON_CHANGE event does not make it a poll)
        # data time of the first reading of a lane's current run of dark readings (under Config.lit_dbm), rx and
        # tx apart; 0: lit or never read. A port shut between two state polls reads dark optics first
        # (rules.awaiting_state)
        self.dark_since = {m: np.zeros(L, np.int64) for m in DARK_METRICS}
        # data time of a port's newest down reading (admin or oper), and of its first up reading since (0: none).
        # Dark optics read in between are the down port's, not its optics' (`_excused`)
        self.down_ms = np.zeros(P, np.int64)
        self.up_ms = np.zeros(P, np.int64)
        self.pf_carry = np.zeros(P, bool)              # a post-FEC alert carries this port's optical episode
        self.down_carry = np.zeros(P, bool)            # this receiver's optical episode took its link down
        self.ld_carry = np.zeros(P, bool)              # this end's link-down alert carries its link's optical episode
        self.pf_last_ms = np.zeros(P, np.int64)        # last cycle a post-FEC finding of its own was built
        self.storm_down = np.zeros(P, bool)            # a flap storm's end whose link went down: its alert goes on
        # layer-1 results, refreshed at each trend bucket close and kept until the next
        self.lane_trend = {k: np.full(L, np.nan) for k in ("rx_slope", "rx_level", "ttt_warn", "ttt_alarm",
                                                            "bias_slope")}
        self.dev_hit = np.zeros((D, HIST), bool)
        self.dev_t = np.zeros((D, HIST), np.uint32)
        self.dev_latched = np.zeros(D, bool)
        self.dev_onset = np.zeros(D, np.int64)
        self.reservoir_x = np.zeros((0, 0))
        self.reservoir_c = np.zeros(0, np.int64)
        self.reservoir_new: list[tuple[np.ndarray, np.ndarray]] = []  # rows added since the last flush
        self.reservoir_pending = 0
        # the stored reservoir (store.save_state) whose rows are this one's first `reservoir_stored`: a save
        # appends the rest; None: write it anew (never stored, or rows since dropped)
        self.reservoir_gen: str | None = None
        self.reservoir_stored = 0
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

        Samples may come at any cadence, per metric: several per entity in a batch are applied in time order,
        one per entity per round, so the result does not depend on how samples were batched; a sample not newer
        than the entity's last one (a duplicate, or a late one already overtaken) changes nothing.
        """
        n = 0
        for metric, (idx, ts, val) in batch.items():
            idx = np.asarray(idx, np.int64)
            ts = np.asarray(ts, np.int64)
            val = np.asarray(val, np.float64)
            if len(idx) and idx.min() < 0:
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
            k_idx, k_ts, k_inc, k_dt = ct.put(idx, ts, val, self.cfg.max_gap_ms)
            self._events(metric, k_idx, k_ts, k_inc, k_dt)
            return
        gt = self.gauges.get(metric)
        if gt is None:
            return
        new = gt.newer(idx, ts)
        idx, ts, val = idx[new], ts[new], val[new]
        if metric in ("port_oper_up", "port_admin_up"):
            self._track_down(metric, idx, ts, val)
        if metric in DARK_METRICS:  # runs of dark readings (NaN: no reading, leaves a run as it was)
            since = self.dark_since[metric]
            ok = np.isfinite(val)
            i2, t2, dark = idx[ok], ts[ok], val[ok] < self.cfg.lit_dbm
            since[i2] = np.where(dark, np.where(since[i2] > 0, since[i2], t2), 0)
            keep = ~(ok & (val < self.cfg.lit_dbm) & self._excused(idx, ts))
            idx, ts, val = idx[keep], ts[keep], val[keep]
        if metric == "optic_rx_power_dbm":  # wobble: mean |successive difference| (fiber, F22)
            ok = np.isfinite(val)
            i2, v2 = idx[ok], val[ok]
            with np.errstate(over="ignore"):  # an absurd finite reading (1e308 dBm) gives inf: not used below
                d = np.abs(v2 - gt.last[i2])
            # a step (>= rx_drop_db) is not a wobble: skip it. A running mean over the first 20 readings, then
            # exponentially weighted (1/20): a lane read every 15 min settles as fast, in readings, as one read
            # every 10 s
            use = np.isfinite(d) & (d < self.cfg.rx_drop_db)
            i2, d = i2[use], d[use]
            n = self.rx_jitter_n[i2] + 1
            j = np.nan_to_num(self.rx_jitter[i2], nan=0.0)
            self.rx_jitter[i2] = j + np.maximum(1.0 / n, 0.05) * (d - j)
            self.rx_jitter_n[i2] = np.minimum(n, 1 << 20)
            self.wob_sum[i2] += d
            self.wob_n[i2] += 1
        gt.put(idx, ts, val)

    def _events(self, metric: str, idx: np.ndarray, ts: np.ndarray, inc: np.ndarray, dt: np.ndarray) -> None:
        """Link events from counter steps, at the step's end time: flaps (ring and penalty) and recoveries."""
        some = inc > 0
        if not some.any():
            return
        idx, ts, inc, dt = idx[some], ts[some], inc[some], dt[some]
        if metric == "port_link_error_recovery_total":
            self.pen["recovery"].add(idx, ts, inc)
            return
        if metric == "port_carrier_changes_total":  # down and up are two changes; only where no flap counter
            keep = ~self.counters["port_link_down_events_total"].seen()[idx]
            idx, ts, inc, dt = idx[keep], ts[keep], np.floor(inc[keep] / 2 + 0.5), dt[keep]
        elif metric != "port_link_down_events_total":
            return
        self._flaps(idx, ts, inc, dt)

    def _flaps(self, idx: np.ndarray, ts: np.ndarray, n: np.ndarray, dt: np.ndarray) -> None:
        # a step longer than the storm window may have spread its flaps over more than one window: count only
        # as many as fit in one window at the step's average rate
        win = self.cfg.flap_storm_window_s * 1000
        n = np.where(dt > win, n * win / np.maximum(dt, 1), n)
        self.flaps.add(idx, ts, n)
        self.pen["flap"].add(idx, ts, n)

    def _excused(self, lanes: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Lane readings made while their port or its far end was down (admin or oper), as far as the state read
        so far says: from before its first up reading since its newest down one. A shut port's laser is off and
        its far end receives nothing; a cycle longer than the state poll reads those dark optics together with
        the reading that says the port is up again, and would judge them as in service."""
        p = self.fabric.lane_port[lanes]
        q = self.fabric.peer[p]
        out = np.zeros(len(lanes), bool)
        for port, valid in ((p, np.ones(len(p), bool)), (np.maximum(q, 0), q >= 0)):
            dm, um = self.down_ms[port], self.up_ms[port]
            out |= valid & (dm > 0) & ((um <= dm) | (ts < um))
        return out

    def _track_down(self, metric: str, idx: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        """Keep `down_since`: an up reading ends a run; an admin-down end (here or at the peer) restarts it.
        And `down_ms`/`up_ms` (`_excused`): an oper-up reading (admin-up where the port reports no oper status)
        after the newest down reading is the port up again.

        An up -> down transition on a port with no flap counter is also a flap (gNMI ON_CHANGE, or polls)."""
        ok = np.isfinite(val)
        idx, ts, val = idx[ok], ts[ok], val[ok]
        down = val < 0.5
        np.maximum.at(self.down_ms, idx[down], ts[down])
        up = ~down & (ts > self.down_ms[idx])
        if metric == "port_admin_up":
            up &= self.gauges["port_oper_up"].last_ts[idx] == 0
        if up.any():
            first = np.full(self.fabric.P, np.iinfo(np.int64).max)
            np.minimum.at(first, idx[up], ts[up])
            mark = (first < np.iinfo(np.int64).max) & (self.up_ms <= self.down_ms)
            self.up_ms[mark] = first[mark]
        peer = self.fabric.peer[idx]
        if metric == "port_admin_up":
            off = idx[val < 0.5]
            self.down_since[off] = 0
            self.down_since[peer[(val < 0.5) & (peer >= 0)]] = 0
            return
        prev = self.gauges["port_oper_up"].last_ts[idx]
        self.oper_gap[idx] = np.where(prev > 0, np.maximum(ts - prev, self.oper_gap[idx] // 2), self.oper_gap[idx])
        oper = self.gauges["port_oper_up"].last[idx]
        went_down = (oper >= 0.5) & (val < 0.5)
        no_counter = ~self.counters["port_link_down_events_total"].seen()[idx] & \
            ~self.counters["port_carrier_changes_total"].seen()[idx]
        if (went_down & no_counter).any():
            sel = went_down & no_counter
            self._flaps(idx[sel], ts[sel], np.ones(int(sel.sum())), np.zeros(int(sel.sum()), np.int64))
        admin = self.gauges["port_admin_up"].last
        peer_admin = np.where(peer >= 0, admin[np.maximum(peer, 0)], np.nan)
        since = self.down_since[idx]
        start = (val < 0.5) & (since == 0) & ~(admin[idx] < 0.5) & ~(peer_admin < 0.5)
        self.down_since[idx] = np.where(val >= 0.5, 0, np.where(start, ts, since))
        self.down_from_up[idx] = np.where(start, went_down, self.down_from_up[idx] & (val < 0.5))

    def settle(self, at_ms: int) -> dict[str, np.ndarray]:
        """Close the cycle's windows into held observations; `fresh_m[metric]` marks entities with new data."""
        stale = self.cfg.stale_ms
        for m, t in (*self.gauges.items(), *self.counters.items()):
            self.fresh_m[m] = t.settle(at_ms, stale)
        for m, g in self.gauges.items():
            self.polls_m[m] = g.w_n.copy()
        for m, c in self.counters.items():
            self.polls_m[m], self.nz_m[m] = c.acc_n.copy(), c.acc_nz.copy()
        return self.fresh_m

    def roll(self) -> None:
        """Start a new cycle window."""
        for t in (*self.gauges.values(), *self.counters.values()):
            t.roll()

    def reservoir_flush(self) -> None:
        """Append the rows added since the last flush (kept as a list: one copy per trim, not per cycle)."""
        if not self.reservoir_new:
            return
        xs = [x for x, _ in self.reservoir_new]
        if self.reservoir_x.shape[1:] != xs[0].shape[1:]:  # the first rows, or another feature layout
            self.reservoir_x, self.reservoir_c = np.zeros((0, *xs[0].shape[1:])), np.zeros(0, np.int64)
            self.reservoir_gen, self.reservoir_stored = None, 0
        self.reservoir_x = np.concatenate([self.reservoir_x, *xs])
        self.reservoir_c = np.concatenate([self.reservoir_c, *(c for _, c in self.reservoir_new)])
        self.reservoir_new = []

    def reservoir_keep(self, keep: np.ndarray) -> None:
        """Keep only these rows of the (flushed) reservoir; the stored one is then written anew."""
        self.reservoir_x, self.reservoir_c = self.reservoir_x[keep], self.reservoir_c[keep]
        self.reservoir_gen, self.reservoir_stored = None, 0

    # -- coverage ----------------------------------------------------------------------------
    def blocked_rules(self, p: int) -> dict[str, str]:
        """Rules that cannot run on port p, and why (empty: all run)."""
        return {k: BLOCKED[int(self.blocked[k][p])] for k in KINDS if self.blocked[k][p]}

    def degraded_rules(self, p: int) -> dict[str, list[str]]:
        """Rules that run on port p without some of their inputs, and what they do instead."""
        return {k: degraded_reasons(int(self.degraded[k][p])) for k in KINDS if self.degraded[k][p]}

    def coverage(self) -> dict[str, dict[str, Any]]:
        """Per port (device:port) with any gap: {"blocked_rules": {rule: reason}, "degraded_rules": {...}}."""
        return coverage_map(self.fabric.port_ids, self.blocked, self.degraded,
                            [self.fabric.port_label(p) for p in range(self.fabric.P)])

    # -- persistence -------------------------------------------------------------------------
    def _arrays(self) -> dict[str, np.ndarray]:
        a: dict[str, np.ndarray] = {"rx_jitter": self.rx_jitter, "rx_jitter_n": self.rx_jitter_n,
                                    "wob_sum": self.wob_sum, "wob_n": self.wob_n, "wob_ref": self.wob_ref,
                                    "flagged": self.flagged,
                                    "down_since": self.down_since, "down_from_up": self.down_from_up,
                                    "oper_gap": self.oper_gap, "down_ms": self.down_ms, "up_ms": self.up_ms,
                                    **{f"dark|{m}": v for m, v in self.dark_since.items()},
                                    "pf_carry": self.pf_carry, "pf_last_ms": self.pf_last_ms,
                                    "down_carry": self.down_carry, "ld_carry": self.ld_carry,
                                    "storm_down": self.storm_down,
                                    "flap_t": self.flaps.t}
        for m, t in self.gauges.items():
            for f in t.FIELDS:
                a[f"g|{m}|{f}"] = getattr(t, f)
        for m, c in self.counters.items():
            for f in c.FIELDS:
                a[f"c|{m}|{f}"] = getattr(c, f)
        for k, b in self.base.items():
            for f in RobustBaseline.FIELDS:
                a[f"b|{k}|{f}"] = getattr(b, f)
        for k, tb in self.trend.items():
            for f in ("b_sum", "b_n"):
                a[f"t|{k}|{f}"] = getattr(tb, f)
        for k, d in self.pen.items():
            for f in DecayedCount.FIELDS:
                a[f"p|{k}|{f}"] = getattr(d, f)
        a["burst_ms"] = self.burst_ms
        for k in KINDS:
            a[f"oh|{k}"], a[f"ot|{k}"] = self.obs_hit[k], self.obs_t[k]
            a[f"l|{k}"], a[f"r|{k}"], a[f"o|{k}"] = self.latched[k], self.last_raw[k], self.onset[k]
            a[f"blk|{k}"], a[f"deg|{k}"] = self.blocked[k], self.degraded[k]
        for k, v in self.lane_trend.items():
            a[f"lt|{k}"] = v
        return a

    def as_saved(self) -> None:
        """Forget what is not saved (this cycle's per-metric results, the rows since the reservoir's last trim), so
        that a state kept in memory after its save goes on exactly as the one `store.load_state` reads back
        would (service/detection/store.py, StateCache)."""
        self.reservoir_flush()
        self.fresh_m = {m: np.zeros(0, bool) for m in AXIS}
        self.polls_m, self.nz_m = {}, {}
        self.reservoir_pending = 0

    def saved_arrays(self, reservoir: bool = True) -> dict[str, np.ndarray]:
        """Every array `to_bytes` saves, by its name in the archive."""
        self.reservoir_flush()
        arrays = self._arrays()
        if reservoir:
            arrays.update({"reservoir_x": self.reservoir_x, "reservoir_c": self.reservoir_c})
        arrays.update({"port_ids": self.fabric.port_ids, "lane_off": self.fabric.lane_off,
                       "dev_names": np.asarray(self.fabric.dev_names, dtype=str), "dev_hit": self.dev_hit,
                       "dev_t": self.dev_t, "dev_latched": self.dev_latched, "dev_onset": self.dev_onset})
        for k, tb in self.trend.items():  # shared across entities: not per-port
            arrays[f"t|{k}|buf"], arrays[f"t|{k}|t"], arrays[f"t|{k}|count"] = tb.buf, tb.t, tb.count
        meta = {"watermark_ms": self.watermark_ms, "last_cycle_ms": self.last_cycle_ms,
                "next_bucket_ms": self.next_bucket_ms, "last_train_ms": self.last_train_ms, "cycles": self.cycles,
                "first_cycle_ms": self.first_cycle_ms, "format": 2}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        return arrays

    def to_bytes(self, reservoir: bool = True) -> bytes:
        """The state as an archive (service/detection/archive.py); without the training reservoir where it is
        stored apart (store.save_state). The reservoir's rows are measured floats, so they are stored as they
        are: deflate took 1/6 off them for 60 % of the save's CPU on a small fabric (docs/benchmarks.md)."""
        return archive.pack(self.saved_arrays(reservoir), plain=_STORED_PLAIN)

    @classmethod
    def from_bytes(cls, data: bytes, fabric: Fabric, config: Config | None = None) -> FeatureState:
        """Restore a state; ports are matched by id, so inventory changes keep what still exists.

        A state saved by an older release (another layout of arrays) keeps what it shares with this one; the
        rest starts empty, as after a fresh start (persistence histories fill again within a few cycles)."""
        st = cls(fabric, config)
        z = archive.Archive(data)
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
        meta = json.loads(bytes(z["meta"]).decode())
        current = meta.get("format") == 2
        names = set(z.files)
        for key, dst in st._arrays().items():
            if key not in names or (not current and key.split("|")[0] in ("g", "c", "b")):
                continue  # absent, or a track saved in the old layout: start it empty
            src = z[key]
            if src.shape[1:] != dst.shape[1:]:
                continue  # a changed size (ring, history): start it empty
            if same and src.shape == dst.shape:
                dst[...] = src
                continue
            n_old = src.shape[0]
            mp = pmap if n_old == len(old_ids) else lmap if n_old == len(old_lane_port) else qmap
            if len(mp) != n_old:
                continue
            ok = mp >= 0
            dst[mp[ok]] = src[ok]
        for k, tb in st.trend.items():
            src = z[f"t|{k}|buf"] if f"t|{k}|buf" in names else None
            if src is not None and src.shape[1:] == tb.buf.shape[1:]:
                if same:
                    tb.buf[...] = src
                else:
                    mp = pmap if src.shape[0] == len(old_ids) else lmap
                    ok = mp >= 0
                    tb.buf[mp[ok]] = src[ok]
                tb.t[:], tb.count[:] = z[f"t|{k}|t"], z[f"t|{k}|count"]
        hit = z["dev_hit"] if "dev_hit" in names else None
        if hit is not None and hit.shape[1:] == st.dev_hit.shape[1:]:  # devices matched by name
            dpos = {n: i for i, n in enumerate(fabric.dev_names)}
            dmap = np.asarray([dpos.get(n, -1) for n in z["dev_names"].tolist()], np.int64)
            ok = dmap >= 0
            st.dev_hit[dmap[ok]], st.dev_t[dmap[ok]] = hit[ok], z["dev_t"][ok]
            st.dev_latched[dmap[ok]], st.dev_onset[dmap[ok]] = z["dev_latched"][ok], z["dev_onset"][ok]
        if "reservoir_x" in names:  # else stored apart (store.load_state), or none
            st.reservoir_x, st.reservoir_c = z["reservoir_x"], z["reservoir_c"]
        st.watermark_ms, st.last_cycle_ms = meta["watermark_ms"], meta["last_cycle_ms"]
        st.next_bucket_ms, st.last_train_ms, st.cycles = meta["next_bucket_ms"], meta["last_train_ms"], meta["cycles"]
        st.first_cycle_ms = meta.get("first_cycle_ms")
        return st

    def take_ports(self, other: FeatureState, ports: np.ndarray) -> None:
        """Take these ports' state (bool mask over the fabric's ports: their lanes, priorities, devices and trend
        buckets) from `other`, a state over the same fabric (a pod moved between shards: service/shards/
        rebalance.py). Trend buckets are matched by bucket (data time): the merged ring keeps the newest."""
        fab = self.fabric
        masks = {fab.P: ports, fab.L: ports[fab.lane_port], fab.P * NPRIO: np.repeat(ports, NPRIO)}
        theirs = other._arrays()
        for key, dst in self._arrays().items():
            mask = masks.get(dst.shape[0])
            if mask is not None and key in theirs and theirs[key].shape == dst.shape:
                dst[mask] = theirs[key][mask]
        devs = np.zeros(len(fab.dev_names), bool)
        devs[fab.dev[ports]] = True
        for a in ("dev_hit", "dev_t", "dev_latched", "dev_onset"):
            getattr(self, a)[devs] = getattr(other, a)[devs]
        step = self.cfg.trend_bucket_ms
        for k, tb in self.trend.items():
            mine, yours = tb.ordered(), other.trend[k].ordered()
            at = {int(t) // step: (int(t), i) for i, t in enumerate(mine[0].tolist())}
            at_other = {int(t) // step: (int(t), i) for i, t in enumerate(yours[0].tolist())}
            keep = sorted(set(at) | set(at_other))[-tb.buf.shape[1]:]
            mask = masks[tb.buf.shape[0]]
            buf = np.full_like(tb.buf, np.nan)
            t = np.full_like(tb.t, -1)
            for j, b in enumerate(keep):
                t[j] = at[b][0] if b in at else at_other[b][0]
                if b in at:
                    buf[~mask, j] = mine[1][~mask, at[b][1]]
                if b in at_other:
                    buf[mask, j] = yours[1][mask, at_other[b][1]]
            tb.buf, tb.t, tb.count[0] = buf, t, len(keep)


def degraded_reasons(bits: int) -> list[str]:
    return [r for i, r in enumerate(DEGRADED) if bits >> i & 1]


def coverage_map(port_ids: np.ndarray, blocked: dict[str, np.ndarray], degraded: dict[str, np.ndarray],
                 labels: list[str] | None = None) -> dict[Any, dict[str, Any]]:
    """{port label (or id): {"blocked_rules": {rule: reason}, "degraded_rules": {rule: [what]}}} for ports with
    any gap, from the saved per-rule arrays."""
    out: dict[Any, dict[str, Any]] = {}
    keys = labels if labels is not None else [int(p) for p in np.asarray(port_ids).tolist()]
    gaps = np.zeros(len(keys), bool)
    for k in KINDS:
        if k in blocked:
            gaps |= blocked[k] > 0
        if k in degraded:
            gaps |= degraded[k] > 0
    for p in np.flatnonzero(gaps).tolist():
        blk = {k: BLOCKED[int(v[p])] for k, v in blocked.items() if v[p]}
        deg = {k: degraded_reasons(int(v[p])) for k, v in degraded.items() if v[p]}
        out[keys[p]] = {"blocked_rules": blk, "degraded_rules": deg}
    return out
