"""A tiny hand-built fabric and a driver for crafted series (no simulator, no database)."""

from __future__ import annotations

import numpy as np

from service.detection.engine import Engine
from service.detection.findings import Finding
from service.detection.state import AXIS, NPRIO, Config, Fabric, FeatureState, thresholds_arrays

TH = {"rx_power_dbm": {"high_alarm": 5.0, "high_warning": 4.0, "low_warning": -4.9, "low_alarm": -6.9},
      "tx_power_dbm": {"high_alarm": 5.0, "high_warning": 4.0, "low_warning": -2.9, "low_alarm": -3.9},
      "tx_bias_amperes": {"high_alarm": 0.08, "high_warning": 0.072, "low_warning": 0.012, "low_alarm": 0.008},
      "temperature_celsius": {"high_alarm": 75, "high_warning": 70, "low_warning": 0, "low_alarm": -5},
      "voltage_volts": {"high_alarm": 3.63, "high_warning": 3.465, "low_warning": 3.135, "low_alarm": 2.97}}
T0 = 1_735_689_600_000


def tiny_fabric(hosts: int = 4, nics: int = 4, lanes: int = 4) -> Fabric:
    """`hosts` hosts with `nics` NICs each, all cabled to one leaf; 400G DR4-like optics."""
    dev_names = [f"h{i}" for i in range(hosts)] + ["leaf"]
    roles = ["host"] * hosts + ["leaf"]
    names, dev, peer, gpu_port = [], [], [], {}
    for h in range(hosts):
        for n in range(nics):
            names.append(f"eth{n}")
            dev.append(h)
            gpu_port[(h, n)] = len(names) - 1
    for k in range(hosts * nics):
        names.append(f"Ethernet1/{k + 1}")
        dev.append(hosts)
    P = len(names)
    half = hosts * nics
    peer = np.concatenate([np.arange(half) + half, np.arange(half)])
    cohort = np.asarray([0 if d < hosts else 1 for d in dev])
    return Fabric(port_ids=np.arange(1, P + 1), port_names=names, dev=np.asarray(dev), dev_names=dev_names,
                  dev_roles=roles, peer=peer, n_lanes=np.full(P, lanes), speed_bps=np.full(P, 400e9),
                  cohort=cohort, cohort_names=["DR4|400G|host", "DR4|400G|leaf"], fec_limit=np.full(P, 2.4e-4),
                  copper=np.zeros(P, bool), th=thresholds_arrays([TH] * P), gpu_port=gpu_port)


class Driver:
    """Healthy readings for every entity each step; tests override what they need per step."""

    def __init__(self, fabric: Fabric | None = None, step_ms: int = 60_000, config: Config | None = None,
                 seed: int = 0) -> None:
        self.fab = fabric or tiny_fabric()
        self.st = FeatureState(self.fab, config)
        self.eng = Engine()
        self.step_ms = step_ms
        self.t = T0
        self.rng = np.random.default_rng(seed)
        P, L = self.fab.P, self.fab.L
        self.rx = np.full(L, -1.0) + self.rng.normal(0, 0.3, L)
        self.tx = np.full(L, 1.0) + self.rng.normal(0, 0.3, L)
        self.bias = np.full(L, 0.04)
        self.counters = {m: np.zeros(P) for m in self.fab_counters()}
        self.prio = {m: np.zeros(P) for m in ("port_pfc_tx_pause_seconds_total", "port_pfc_rx_pause_seconds_total")}
        self.oper = np.ones(P)
        self.admin = np.ones(P)
        self.pcie = np.full(P, 16.0)

    @staticmethod
    def fab_counters() -> tuple[str, ...]:
        return ("port_rx_phy_bits_total", "port_fec_corrected_bits_total", "port_link_down_events_total",
                "port_link_error_recovery_total", "port_fec_uncorrectable_codewords_total", "port_symbol_errors_total",
                "port_rx_bytes_total", "port_rx_packets_total", "port_ecn_marked_packets_total",
                "port_pause_storm_warning_events_total", "port_pause_storm_error_events_total")

    def healthy_increments(self, dt_s: float) -> dict[str, np.ndarray]:
        P = self.fab.P
        bits = 400e9 * dt_s * np.ones(P)
        return {"port_rx_phy_bits_total": bits, "port_fec_corrected_bits_total": bits * 1e-8,
                "port_rx_bytes_total": bits / 8 * 0.3, "port_rx_packets_total": bits / 8 * 0.3 / 4096,
                "port_ecn_marked_packets_total": bits / 8 * 0.3 / 4096 * 1e-4}

    def step(self, inc: dict[str, np.ndarray] | None = None, prio_inc: dict[str, np.ndarray] | None = None,
             rx: np.ndarray | None = None, drop: set[str] | None = None, silent: np.ndarray | None = None) -> None:
        """Advance one step: add healthy increments (+ extra), emit every metric, observe (`silent`: ports whose
        readings this poll missed, lanes and priorities included)."""
        self.t += self.step_ms
        dt = self.step_ms / 1000
        add = self.healthy_increments(dt)
        for m, v in (inc or {}).items():
            add[m] = add.get(m, 0) + v
        for m, v in add.items():
            self.counters[m] = self.counters[m] + v
        for m, v in (prio_inc or {}).items():
            self.prio[m] = self.prio[m] + v
        P, L = self.fab.P, self.fab.L
        noise = self.rng.normal(0, 0.1, L)
        ts_p, ts_l = np.full(P, self.t), np.full(L, self.t)
        ar_p, ar_l = np.arange(P), np.arange(L)
        b = {m: (ar_p, ts_p, np.floor(v)) for m, v in self.counters.items()}
        b.update({m: (ar_p * NPRIO + 3, ts_p, v) for m, v in self.prio.items()})
        b["optic_rx_power_dbm"] = (ar_l, ts_l, (self.rx if rx is None else rx) + noise)
        b["optic_tx_power_dbm"] = (ar_l, ts_l, self.tx + self.rng.normal(0, 0.03, L))
        b["optic_tx_bias_amperes"] = (ar_l, ts_l, self.bias * (1 + self.rng.normal(0, 0.005, L)))
        b["optic_temperature_celsius"] = (ar_p, ts_p, 45 + self.rng.normal(0, 0.2, P))
        b["optic_voltage_volts"] = (ar_p, ts_p, np.full(P, 3.3))
        b["port_oper_up"] = (ar_p, ts_p, self.oper.copy())
        b["port_admin_up"] = (ar_p, ts_p, self.admin.copy())
        b["gpu_pcie_link_width"] = (ar_p, ts_p, self.pcie.copy())
        for m in drop or ():
            b.pop(m, None)
        if silent is not None and len(silent):
            for m, (idx, ts, v) in list(b.items()):
                port = self.fab.lane_port[idx] if AXIS[m] == "lane" else idx // NPRIO if AXIS[m] == "prio" else idx
                keep = ~np.isin(port, silent)
                b[m] = (idx[keep], ts[keep], v[keep])
        self.st.observe(b)

    def cycle(self) -> list[Finding]:
        return self.eng.run_cycle(self.st, self.t)

    def run(self, n: int, **kw: object) -> list[Finding]:
        out: list[Finding] = []
        for _ in range(n):
            self.step(**kw)  # type: ignore[arg-type]
            out += self.cycle()
        return out

    def port(self, dev: str, name: str) -> int:
        return next(i for i in range(self.fab.P) if self.fab.dev_names[self.fab.dev[i]] == dev
                    and self.fab.port_names[i] == name)


def firing(findings: list[Finding], kind: str | None = None) -> list[Finding]:
    return [f for f in findings if f.state == "firing" and (kind is None or f.kind == kind)]
