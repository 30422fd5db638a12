"""Telemetry model: a fabric's canonical metrics, one time step at a time, vectorised per metric.

``FabricModel`` compiles an inventory into flat numpy arrays (ports, lanes, peers, GPUs).
``FabricSim`` owns the evolving state (counters, flap and storm state) and advances it
step by step; each step yields a ``Frame``: per metric block, one value array aligned
with a fixed series index. The bulk writer formats Frames directly; ``simulate`` turns
them into ``Sample`` lists; ``FabricSim.port_samples`` answers "this port at time t" for a
live server. Noise for step k is drawn from ``default_rng([seed, k])``, so the same seed
gives the same data however the range is chunked.

Physics (detection.md 1A-1E): rx at one end = tx at the other end - link loss - fault loss,
read with per-module noise (0.1-0.2 dB) and ~0.1 dB/C temperature bias; pre-FEC BER is
log-uniform 1e-9..1e-6 at nominal power (PAM4) and rises ~1 decade per dB lost; post-FEC
errors appear only past the FEC limit; ECN/CNP follow load; PFC is rare unless a fault
or hotspot forces it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from service.inventory.schemas import Inventory
from service.telemetry.catalogue import METRICS, Entity
from service.telemetry.samples import Sample
from simulator import optics
from simulator.topology import TopologyParams, build_topology_dict, inventory_dict

LMAX = 8
PRIORITY = 3  # the lossless RoCE priority
DARK_DBM = -40.0  # what DOM reads for 0 mW (detection.md F4)
MTU = 4096
U64 = np.uint64


@dataclass
class Workload:
    """Job shape shared by a pod: iterations of compute + collective burst, some all-to-all, idle gaps."""

    period_s: float = 300.0
    burst_duty: float = 0.35
    burst_util: float = 0.85
    compute_util: float = 0.06
    alltoall_every: int = 4
    idle_hours_per_day: float = 1.0

    def pod_util(self, t0: float, t1: float, phase: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean utilisation per pod over [t0, t1), and the all-to-all share of it."""
        ts = np.linspace(t0, t1, 9)[:-1][None, :] + phase[:, None] * self.period_s
        it = np.floor(ts / self.period_s)
        inburst = (ts / self.period_s - it) < self.burst_duty
        a2a = (it.astype(np.int64) % max(1, self.alltoall_every)) == 0
        day_pos = ((ts + phase[:, None] * 86400) % 86400) / 3600.0
        idle = day_pos < self.idle_hours_per_day
        u = np.where(inburst, self.burst_util, self.compute_util)
        u = np.where(idle, 0.005, u)
        return u.mean(axis=1), (inburst & a2a & ~idle).mean(axis=1)


class FabricModel:
    """Static arrays for every linked port of an inventory (both ends of each link)."""

    def __init__(self, inv: Inventory | dict[str, Any], seed: int = 0) -> None:
        d = inventory_dict(inv)
        rng = np.random.default_rng([seed, 0x5EED])
        self.dev_names: list[str] = []
        self.dev_role: list[str] = []
        self.dev_pod: list[str] = []
        port_at: dict[tuple[str, str], dict[str, Any]] = {}
        dev_index: dict[str, int] = {}
        for dev in d["devices"]:
            dev_index[dev["name"]] = len(self.dev_names)
            self.dev_names.append(dev["name"])
            self.dev_role.append(dev["role"])
            self.dev_pod.append(dev.get("pod") or "")
            for p in dev.get("ports", []):
                port_at[(dev["name"], p["name"])] = p
        names: list[tuple[str, str]] = []
        peer: list[int] = []
        for link in d["links"]:
            a, b = (tuple(link[k].split(":", 1)) for k in ("a", "b"))
            ia = len(names)
            names += [a, b]  # type: ignore[list-item]
            peer += [ia + 1, ia]
        P = len(names)
        self.P = P
        self.port_dev_name = [n[0] for n in names]
        self.port_name = [n[1] for n in names]
        self.index = {n: i for i, n in enumerate(names)}
        if len(self.index) != P:
            raise ValueError("a port appears in more than one link")
        self.peer = np.asarray(peer, dtype=np.int64)
        self.dev = np.asarray([dev_index[n[0]] for n in names], dtype=np.int64)
        self.is_host = np.asarray([self.dev_role[i] == "host" for i in self.dev])
        speed, lanes, spec_i, gpu = [], [], [], []
        types = list(optics.CATALOGUE)
        for dn, pn in names:
            p = port_at.get((dn, pn), {})
            o = p.get("optic") or {}
            t = o.get("type")
            spd = p.get("speed_gbps") or (optics.spec(t).speed_gbps if t in optics.CATALOGUE else 400)
            speed.append(float(spd) * 1e9)
            lanes.append(int(o.get("lanes", 4)))
            spec_i.append(types.index(t) if t in optics.CATALOGUE else -1)
            gpu.append(p.get("gpu", -1) if p.get("gpu") is not None else -1)
        self.speed_bps = np.asarray(speed)
        self.lanes = np.clip(np.asarray(lanes, dtype=np.int64), 1, LMAX)
        self.lane_mask = np.arange(LMAX)[None, :] < self.lanes[:, None]
        self.spec_i = np.asarray(spec_i, dtype=np.int64)
        specs = [optics.CATALOGUE[types[i]] if i >= 0 else optics.CATALOGUE["400G-DR4"] for i in spec_i]
        self.dom = np.asarray([s.dom and i >= 0 for s, i in zip(specs, spec_i, strict=True)])
        self.pam4 = np.asarray([s.signalling == "PAM4" for s in specs])
        self.fec_limit = np.asarray([s.fec_limit_ber for s in specs])
        self.los_dbm = np.asarray([s.los_dbm for s in specs])
        tx_lo = np.asarray([s.tx_min_dbm for s in specs])
        tx_hi = np.asarray([s.tx_max_dbm for s in specs])
        self.rx_low_alarm = np.asarray([s.rx_min_dbm - 1 for s in specs])
        self.gpu = np.asarray(gpu, dtype=np.int64)
        # per-module draws: nominal Tx well inside spec, link loss, reading noise, temperature
        mid = (tx_lo + tx_hi) / 2
        self.tx_nom = (mid[:, None] + rng.normal(0, 0.6, (P, 1)) + rng.normal(0, 0.25, (P, LMAX)))
        self.tx_nom = np.minimum(self.tx_nom, tx_hi[:, None] - 0.5)
        self.loss = rng.uniform(0.4, 1.5, (P, 1)) + np.abs(rng.normal(0, 0.25, (P, LMAX)))
        self.noise_db = rng.uniform(0.1, 0.2, P)
        self.temp_coef = rng.uniform(0.06, 0.12, P)  # DDM rx reading bias, dB/C (F6)
        self.bias_nom = (np.asarray([s.bias_nominal_a for s in specs])[:, None]
                         * rng.normal(1.0, 0.08, (P, LMAX)))
        self.temp_base = rng.uniform(36, 50, P)
        self.temp_amp = rng.uniform(1.5, 4.0, P)
        self.temp_phase = rng.uniform(-0.1, 0.1, P)
        self.volt_nom = rng.normal(3.30, 0.03, P)
        self.base_log_ber = np.where(self.pam4, rng.uniform(-9, -6, P), rng.uniform(-12, -9, P))
        self.ber_slope = np.where(self.pam4, 1.0, 0.8)  # decades per dB below nominal rx
        self.counter_start = rng.integers(0, 2**40, P).astype(U64)  # devices have uptime before t0
        # pods and GPUs
        pods = sorted(set(self.dev_pod))
        self.pods = pods
        self.port_pod = np.asarray([pods.index(self.dev_pod[i]) for i in self.dev], dtype=np.int64)
        self.pod_phase = rng.uniform(0, 1, len(pods))
        gdev, gidx, gport = [], [], []
        for i in range(P):
            if self.is_host[i] and self.gpu[i] >= 0:
                gdev.append(self.dev[i])
                gidx.append(self.gpu[i])
                gport.append(i)
        self.gpu_dev = np.asarray(gdev, dtype=np.int64)
        self.gpu_idx = np.asarray(gidx, dtype=np.int64)
        self.gpu_port = np.asarray(gport, dtype=np.int64)
        self.gpu_temp_base = rng.uniform(38, 46, len(gdev))

    def port(self, device: str, port: str) -> int:
        try:
            return self.index[(device, port)]
        except KeyError:
            raise KeyError(f"{device}:{port} is not a linked port of this inventory") from None

    def device_ports(self, device: str) -> np.ndarray:
        if device not in self.dev_names:
            raise KeyError(f"device {device!r} is not in this inventory")
        return np.flatnonzero(self.dev == self.dev_names.index(device))


@dataclass
class Effects:
    """What faults do to one interval; arrays are reset every step and applied by the model."""

    rx_loss_db: np.ndarray  # (P, L) extra loss on the light arriving at this port
    tx_delta_db: np.ndarray  # (P, L) change of this port's own launched power
    bias_mult: np.ndarray  # (P, L)
    ber_add_dec: np.ndarray  # (P,) decades added to pre-FEC BER
    post_fec_ber: np.ndarray  # (P,) forced post-FEC BER (electrical faults)
    flaps: np.ndarray  # (P,) link-down events this interval (counted at both ends by the model)
    recoveries: np.ndarray  # (P,) link error recoveries
    down: np.ndarray  # (P,) bool: link down at the sample instant
    admin_down: np.ndarray  # (P,) bool
    util_mult: np.ndarray  # (P,) scales what this port transmits
    rx_drain: np.ndarray  # (P,) fraction of offered rx this port accepts (a stuck NIC: ~0)
    ecn_frac_add: np.ndarray  # (P,) extra ECN-marked share of received packets
    tx_pause_duty: np.ndarray  # (P,) forced tx pause duty (max with the baseline)
    storm_warn: np.ndarray  # (P,)
    storm_err: np.ndarray  # (P,)
    pcie_width: np.ndarray  # (G,)
    pcie_gen: np.ndarray  # (G,)
    resets: np.ndarray  # (P,) bool: counters restart from 0 this step
    temp_add: np.ndarray  # (P,)

    @classmethod
    def blank(cls, P: int, G: int) -> Effects:
        z = np.zeros
        return cls(z((P, LMAX)), z((P, LMAX)), np.ones((P, LMAX)), z(P), z(P), z(P), z(P), z(P, bool),
                   z(P, bool), np.ones(P), np.ones(P), z(P), z(P), z(P), z(P), np.full(G, 16.0),
                   np.full(G, 5.0), z(P, bool), z(P))


class Fault(Protocol):
    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None: ...


class Artefacts(Protocol):
    """Telemetry-side artefacts: applied to reported values, never to the physics."""

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None: ...


@dataclass
class Block:
    """One metric over a fixed set of series: port index (and lane/priority/gpu) per series."""

    metric: str
    ports: np.ndarray  # port index per series (-1 for GPU series)
    lane: np.ndarray | None = None
    gpu_dev: np.ndarray | None = None
    gpu: np.ndarray | None = None
    counter_bits: np.ndarray | None = None  # per series, 0 = native 64-bit
    saturating: np.ndarray | None = None

    @property
    def entity(self) -> Entity:
        return METRICS[self.metric].entity


@dataclass
class Frame:
    """One step: ts and, per block, the values (NaN allowed) and a keep-mask (missing samples)."""

    t: float
    ts_ms: np.ndarray  # per device
    values: dict[str, np.ndarray] = field(default_factory=dict)
    keep: dict[str, np.ndarray] = field(default_factory=dict)


COUNTERS_PORT = [
    "port_link_down_events_total", "port_link_error_recovery_total", "port_rx_bytes_total",
    "port_tx_bytes_total", "port_rx_packets_total", "port_tx_packets_total", "port_rx_errors_total",
    "port_rx_fcs_errors_total", "port_rx_discards_total", "port_symbol_errors_total",
    "port_rx_phy_bits_total", "port_fec_corrected_bits_total", "port_fec_corrected_codewords_total",
    "port_fec_uncorrectable_codewords_total", "port_ecn_marked_packets_total",
]
COUNTERS_HOST = ["port_carrier_changes_total", "port_cnp_sent_total", "port_cnp_handled_total",
                 "port_pause_storm_warning_events_total", "port_pause_storm_error_events_total"]
COUNTERS_PRIO = ["port_pfc_rx_pause_frames_total", "port_pfc_tx_pause_frames_total",
                 "port_pfc_rx_pause_seconds_total", "port_pfc_tx_pause_seconds_total"]
GAUGES_PORT = ["port_oper_up", "port_admin_up", "port_speed_bits_per_second", "port_pre_fec_ber"]
OPTIC_LANE = ["optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes"]
OPTIC_PORT = ["optic_temperature_celsius", "optic_voltage_volts"]
GPU_GAUGES = ["gpu_pcie_link_generation", "gpu_pcie_link_width", "gpu_temperature_celsius"]
# counters of discrete events; every other counter integrates a rate over the step's span
EVENT_COUNTERS = {"port_link_down_events_total", "port_link_error_recovery_total", "port_carrier_changes_total",
                  "port_pause_storm_warning_events_total", "port_pause_storm_error_events_total"}
# pause seconds are kept in microseconds internally so the counters stay integers
_US_COUNTERS = {"port_pfc_rx_pause_seconds_total", "port_pfc_tx_pause_seconds_total"}


def make_blocks(m: FabricModel, groups: set[str] | None = None) -> list[Block]:
    """The fixed series layout: which metrics exist for which ports, lanes and GPUs."""
    allp = np.arange(m.P)
    host = np.flatnonzero(m.is_host)
    dom = np.flatnonzero(m.dom)
    lp, ll = np.nonzero(m.lane_mask & m.dom[:, None])
    blocks = [Block(n, allp) for n in GAUGES_PORT + COUNTERS_PORT]
    blocks.append(Block("port_fec_lane_errors_total", *np.nonzero(m.lane_mask)))
    blocks += [Block(n, host) for n in COUNTERS_HOST]
    blocks += [Block(n, allp) for n in COUNTERS_PRIO]
    blocks += [Block(n, lp, ll) for n in OPTIC_LANE]
    blocks += [Block(n, dom) for n in OPTIC_PORT]
    G = len(m.gpu_dev)
    blocks += [Block(n, np.full(G, -1), gpu_dev=m.gpu_dev, gpu=m.gpu_idx) for n in GPU_GAUGES]
    if groups:
        blocks = [b for b in blocks if METRICS[b.metric].group in groups]
    return blocks


class FabricSim:
    """The evolving state of a fabric; ``step`` advances it by one interval."""

    def __init__(self, model: FabricModel, faults: list[Fault] | None = None,
                 artefacts: list[Artefacts] | None = None, workload: Workload | None = None,
                 seed: int = 0, groups: set[str] | None = None, jitter_ms: int = 0) -> None:
        self.m = model
        self.faults = faults or []
        self.artefacts = artefacts or []
        self.wl = workload or Workload()
        self.seed = seed
        self.jitter_ms = jitter_ms
        self.blocks = make_blocks(model, groups)
        self.block = {b.metric: b for b in self.blocks}
        P = model.P
        self.c: dict[str, np.ndarray] = {n: np.zeros(P, U64) for n in COUNTERS_PORT + COUNTERS_HOST
                                         + COUNTERS_PRIO}
        for n in ("port_rx_bytes_total", "port_tx_bytes_total", "port_rx_phy_bits_total"):
            self.c[n] += model.counter_start
        self.c_lane = np.zeros((P, LMAX), U64)
        self.k = 0
        self.t: float | None = None
        self.last: Frame | None = None
        for art in self.artefacts:  # artefacts may mark series as 32-bit or saturating
            setup = getattr(art, "setup", None)
            if setup is not None:
                setup(self)

    def _add(self, name: str, inc: np.ndarray) -> None:
        self.c[name] += np.rint(np.maximum(inc, 0)).astype(U64)

    def step(self, t: float, dt: float, span: float | None = None) -> Frame:
        """Advance over (t - dt, t] and report the state at t.

        Faults, workload and events follow data time (t, dt); traffic, FEC and pause counters grow by
        what `span` seconds at those rates carry (default dt). A live fabric that runs data time faster
        than the clock passes the wall seconds here, so rates read against wall stamps stay physical.
        """
        span = dt if span is None else span
        m, P = self.m, self.m.P
        rng = np.random.default_rng([self.seed, int(round(t))])
        fx = Effects.blank(P, len(m.gpu_dev))
        t0 = t - dt
        for f in self.faults:
            f.apply(m, fx, t0, t, rng)
        self.k += 1
        self.t = t
        pr = m.peer
        # --- link state: admin down at either end, loss of light, forced down ---
        admin = ~fx.admin_down
        tx_on = admin[:, None] & m.lane_mask
        day = 2 * np.pi * (t / 86400.0 + m.temp_phase)
        # --- workload ---
        pu, a2a = self.wl.pod_util(t0, t, m.pod_phase)
        util = pu[m.port_pod] * rng.normal(1.0, 0.04, P)
        # octet counters leave out preamble and gap, and DCQCN holds a saturated link a few % under line
        # rate: counters read <= 96 %, so even a poll stamped a little off its read never passes 100 %
        util = np.clip(util * fx.util_mult, 0, 0.96)
        temp = (m.temp_base + m.temp_amp * np.sin(day) + 3.0 * util + fx.temp_add
                + rng.normal(0, 0.15, P))
        # --- optics (true values) ---
        tx_true = m.tx_nom - 0.01 * (temp - m.temp_base)[:, None] + fx.tx_delta_db
        tx_true = np.where(tx_on, tx_true, DARK_DBM)
        rx_true = tx_true[pr] - m.loss - fx.rx_loss_db
        rx_true = np.where(m.lane_mask & (tx_true[pr] > DARK_DBM + 1), rx_true, DARK_DBM)
        rx_nom = m.tx_nom[pr] - m.loss
        lane_los = (rx_true < m.los_dbm[:, None]) & m.lane_mask & m.dom[:, None]
        # --- BER per lane, from optical margin ---
        deficit = np.clip(rx_nom - rx_true, 0, 40)
        log_ber = (m.base_log_ber[:, None] + m.ber_slope[:, None] * deficit + fx.ber_add_dec[:, None])
        log_ber = np.clip(log_ber + rng.normal(0, 0.05, (P, LMAX)), -15, -1.3)
        ber_lane = np.where(m.lane_mask, 10.0**log_ber, 0.0)
        ber = ber_lane.sum(1) / m.lanes
        link_bad = lane_los.any(1) | (ber > 20 * m.fec_limit)
        down = ~admin | ~admin[pr] | link_bad | link_bad[pr] | fx.down | fx.down[pr]
        up = ~down
        # flaps count at both ends of a link; a new hard-down counts once when it starts
        flaps = fx.flaps + fx.flaps[pr]
        if self.last is not None and "port_oper_up" in self.last.values:
            was_up = self.last.values["port_oper_up"] > 0.5
            flaps = flaps + (was_up & down & ~fx.admin_down)
        rec = fx.recoveries + fx.recoveries[pr]
        up_frac = np.where(up, 1.0, 0.0) * np.clip(1 - 2.0 * flaps * 5 / dt, 0, 1)  # ~5 s retrain per flap
        # --- traffic: tx at this end, rx = peer's tx accepted by this end ---
        line = m.speed_bps / 8 * span
        tx_bytes = util * line * up_frac * admin
        # a stuck receiver drains ~nothing, so its peer can send ~nothing
        tx_bytes = tx_bytes * fx.rx_drain[pr]
        rx_bytes = tx_bytes[pr]
        tx_pk = tx_bytes / MTU
        rx_pk = rx_bytes / MTU
        phy_bits = m.speed_bps * span * up_frac
        corr_lane = rng.poisson(np.minimum(ber_lane * (phy_bits / m.lanes)[:, None], 1e15))
        corr = corr_lane.sum(1)
        cw_bits = 5140.0
        cw_total = phy_bits / cw_bits
        # post-FEC: ~1e-13 at the FEC limit, a cliff beyond (RS(544,514) waterfall)
        p_ucw = 1e-13 * 10.0 ** (8.0 * (np.log10(np.maximum(ber, 1e-18)) - np.log10(m.fec_limit)))
        p_ucw = np.minimum(p_ucw + fx.post_fec_ber * cw_bits, 1.0)
        ucw = rng.poisson(np.minimum(p_ucw * cw_total, 1e12)) * up
        fcs = rng.poisson(np.minimum(ucw * 0.9 * np.minimum(rx_pk / np.maximum(cw_total, 1), 1) + ucw * 0.1,
                                     1e12))
        # --- congestion: ECN with load and all-to-all incast, rare PFC ---
        a2a_p = a2a[m.port_pod]
        rx_util = np.where(line > 0, rx_bytes / line, 0)
        ecn_frac = 2e-5 + 0.012 * np.clip((rx_util - 0.45) / 0.5, 0, 1) ** 2 * (1 + 2 * a2a_p)
        ecn_frac = np.minimum(ecn_frac + fx.ecn_frac_add, 0.5)
        ecn = rng.poisson(np.minimum(rx_pk * ecn_frac, 1e13))
        occasional = rng.random(P) < 0.08
        base_duty = occasional * 0.003 * np.clip((rx_util - 0.7) / 0.25, 0, 1) * (1 + a2a_p)
        tx_duty = np.clip(np.maximum(base_duty, fx.tx_pause_duty), 0, 1) * up
        rx_duty = tx_duty[pr]
        quanta_s = 65535 * 512 / m.speed_bps
        # --- counters ---
        a = self._add
        a("port_link_down_events_total", flaps)
        a("port_link_error_recovery_total", rec)
        a("port_rx_bytes_total", rx_bytes)
        a("port_tx_bytes_total", tx_bytes)
        a("port_rx_packets_total", rx_pk)
        a("port_tx_packets_total", tx_pk)
        a("port_rx_errors_total", fcs)
        a("port_rx_fcs_errors_total", fcs)
        a("port_rx_discards_total", rng.poisson(rx_pk * 1e-10))
        a("port_symbol_errors_total", ucw * 16)
        a("port_rx_phy_bits_total", phy_bits)
        a("port_fec_corrected_bits_total", corr)
        a("port_fec_corrected_codewords_total", np.minimum(corr / 1.06, cw_total))
        a("port_fec_uncorrectable_codewords_total", ucw)
        a("port_ecn_marked_packets_total", ecn)
        a("port_carrier_changes_total", 2 * flaps)
        cnp = np.minimum(ecn * 0.6, rx_pk) * m.is_host
        a("port_cnp_sent_total", cnp)
        # senders are remote: a host handles its pod's CNPs in proportion to what it sends
        npod = len(m.pods)
        hosts_in_pod = np.maximum(np.bincount(m.port_pod, weights=m.is_host, minlength=npod), 1)
        cnp_pod = np.bincount(m.port_pod, weights=cnp, minlength=npod) / hosts_in_pod
        u_pod = np.bincount(m.port_pod, weights=util * m.is_host, minlength=npod) / hosts_in_pod
        a("port_cnp_handled_total", cnp_pod[m.port_pod] * util / np.maximum(u_pod[m.port_pod], 1e-3))
        a("port_pause_storm_warning_events_total", fx.storm_warn)
        a("port_pause_storm_error_events_total", fx.storm_err)
        a("port_pfc_tx_pause_frames_total", tx_duty * span / (quanta_s / 2))
        a("port_pfc_rx_pause_frames_total", rx_duty * span / (quanta_s[pr] / 2))
        a("port_pfc_tx_pause_seconds_total", tx_duty * span * 1e6)
        a("port_pfc_rx_pause_seconds_total", rx_duty * span * 1e6)
        self.c_lane += corr_lane.astype(U64)
        if fx.resets.any():  # driver reload / reboot: counters restart from zero
            for arr in self.c.values():
                arr[fx.resets] = 0
            self.c_lane[fx.resets] = 0
        # --- readings ---
        noise = rng.normal(0, 1, (P, LMAX)) * m.noise_db[:, None]
        rx_read = rx_true + m.temp_coef[:, None] * (temp - m.temp_base)[:, None] + noise
        rx_read = np.where(rx_true <= DARK_DBM + 1, DARK_DBM, np.maximum(rx_read, DARK_DBM))
        rx_read = np.where(admin[:, None], rx_read, DARK_DBM)  # admin down: module in low power, reads 0 mW
        tx_read = np.where(tx_true <= DARK_DBM + 1, DARK_DBM,
                           tx_true + rng.normal(0, 0.05, (P, LMAX)))
        bias = m.bias_nom * fx.bias_mult * (1 + 0.003 * (temp - m.temp_base))[:, None]
        bias = np.where(tx_on, bias + rng.normal(0, 2e-4, (P, LMAX)), 0.0)
        gp = m.gpu_port
        g_util = util[gp] if len(gp) else np.zeros(0)
        gtemp = m.gpu_temp_base + 30 * g_util + rng.normal(0, 0.5, len(gp))
        vals: dict[str, np.ndarray] = {
            "port_oper_up": up.astype(float),
            "port_admin_up": admin.astype(float),
            "port_speed_bits_per_second": m.speed_bps,
            "port_pre_fec_ber": np.where(up, corr / np.maximum(phy_bits, 1), 0.0),
            "optic_rx_power_dbm": rx_read,
            "optic_tx_power_dbm": tx_read,
            "optic_tx_bias_amperes": bias,
            "optic_temperature_celsius": temp,
            "optic_voltage_volts": m.volt_nom + rng.normal(0, 0.004, P),
            "gpu_pcie_link_generation": fx.pcie_gen,
            "gpu_pcie_link_width": fx.pcie_width,
            "gpu_temperature_celsius": gtemp,
        }
        frame = Frame(t=t, ts_ms=self._ts(t, rng))
        for b in self.blocks:
            n = b.metric
            if n in self.c:
                v = self.c[n][b.ports]
                if n in _US_COUNTERS:
                    v = v / 1e6
            elif n == "port_fec_lane_errors_total":
                v = self.c_lane[b.ports, b.lane]
            elif b.lane is not None:
                v = vals[n][b.ports, b.lane]
            elif b.gpu is not None:
                v = vals[n]
            else:
                v = vals[n][b.ports]
            frame.values[n] = v
        self.phys = {"util": util, "ber": ber, "up": up, "rx_true": rx_true, "tx_true": tx_true,
                     "tx_duty": tx_duty, "rx_bytes": rx_bytes}  # ground-truth view for tests/debugging
        for art in self.artefacts:
            art.report(m, frame, rng)
        self.last = frame
        if "port_oper_up" not in frame.values:  # keep link-state memory even when not reported
            frame.values["port_oper_up"] = up.astype(float)
        return frame

    def _ts(self, t: float, rng: np.random.Generator) -> np.ndarray:
        nd = len(self.m.dev_names)
        base = np.full(nd, int(round(t * 1000)), dtype=np.int64)
        if self.jitter_ms:
            base += rng.integers(-self.jitter_ms, self.jitter_ms + 1, nd)
        return base

    def port_samples(self, device: str, port: str, frame: Frame | None = None) -> list[Sample]:
        """The samples of one port (and its lanes) in a frame, by default the latest: for live servers."""
        frame = frame or self.last
        if frame is None:
            return []
        i = self.m.port(device, port)
        return [s for s in frame_samples(self, frame, only_port=i)]


def frame_samples(sim: FabricSim, frame: Frame, only_port: int | None = None) -> Iterator[Sample]:
    """Samples of a frame, in block order (the slow, object path)."""
    m = sim.m
    for b in sim.blocks:
        if b.metric not in frame.values:
            continue
        v = frame.values[b.metric]
        keep = frame.keep.get(b.metric)
        idx = np.flatnonzero(b.ports == only_port) if only_port is not None else range(len(v))
        for j in idx:
            if keep is not None and not keep[j]:
                continue
            bits = int(b.counter_bits[j]) if b.counter_bits is not None and b.counter_bits[j] else None
            sat = bool(b.saturating[j]) if b.saturating is not None else False
            if b.gpu is not None:
                dev = int(b.gpu_dev[j])
                yield Sample(b.metric, float(v[j]), int(frame.ts_ms[dev]), m.dev_names[dev], gpu=int(b.gpu[j]))
                continue
            p = int(b.ports[j])
            dev = int(m.dev[p])
            ent = b.entity
            yield Sample(b.metric, float(v[j]), int(frame.ts_ms[dev]), m.dev_names[dev], m.port_name[p],
                         lane=int(b.lane[j]) if ent is Entity.LANE else None,
                         priority=PRIORITY if ent is Entity.PRIORITY else None,
                         counter_bits=bits, saturating=sat)


def resolve_inventory(source: Inventory | dict[str, Any] | TopologyParams) -> dict[str, Any]:
    if isinstance(source, TopologyParams):
        return build_topology_dict(source)
    return inventory_dict(source)


def timeline(start: float, end: float, step: float) -> Iterator[float]:
    """Sample instants start+step .. end (each closes the interval before it)."""
    n = int(np.floor((end - start) / step + 1e-9))
    for k in range(1, n + 1):
        yield start + k * step


def simulate(source: Inventory | dict[str, Any] | TopologyParams | None, scenario: Any = None,
             start: float = 0.0, end: float = 3600.0, step: float = 60.0,
             seed: int | None = None) -> Iterator[list[Sample]]:
    """Stream one list of Samples per time step. ``scenario`` is a scenarios.Scenario (or None).

    Times are Unix seconds. Memory stays bounded: one step of arrays at a time.
    """
    sim = make_sim(source, scenario, start, seed)
    for t in timeline(start, end, step):
        frame = sim.step(t, step)
        yield list(frame_samples(sim, frame))


def make_sim(source: Inventory | dict[str, Any] | TopologyParams | None, scenario: Any, start: float,
             seed: int | None = None, groups: set[str] | None = None) -> FabricSim:
    """Compile an inventory (or the scenario's own topology) and bind the scenario's faults."""
    if source is None:
        if scenario is None:
            raise ValueError("need an inventory, topology parameters or a scenario with a topology")
        source = scenario.inventory_source()
    inv = resolve_inventory(source)
    if seed is None:
        seed = scenario.seed if scenario is not None else 0
    model = FabricModel(inv, seed)
    if scenario is None:
        return FabricSim(model, seed=seed, groups=groups)
    faults, arts = scenario.bind(model, start)
    return FabricSim(model, faults, arts, scenario.workload.to_model(), seed=seed, groups=groups,
                     jitter_ms=scenario.artefacts.jitter_ms)
