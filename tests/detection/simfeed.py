"""Feed simulator frames straight into a FeatureState (no database): fast scenario tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.detection.engine import Engine
from service.detection.findings import Finding
from service.detection.state import AXIS, NPRIO, Config, Fabric, FeatureState, fec_limit_for, thresholds_arrays
from simulator.scenarios import Scenario
from simulator.telemetry import PRIORITY, FabricSim, make_sim, timeline

T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z


def fabric_from_inventory(inv: dict[str, Any]) -> Fabric:
    """The same Fabric load_fabric builds from the tables, from an inventory dict."""
    dev_names, dev_roles, names, dev, lanes, speed, fec, copper, cohorts, th = ([] for _ in range(10))
    gpu_port: dict[tuple[int, int], int] = {}
    pos: dict[tuple[str, str], int] = {}
    for d in inv["devices"]:
        di = len(dev_names)
        dev_names.append(d["name"])
        dev_roles.append(d["role"])
        for p in d.get("ports", []):
            i = len(names)
            pos[(d["name"], p["name"])] = i
            o = p.get("optic") or {}
            spd = p.get("speed_gbps")
            names.append(p["name"])
            dev.append(di)
            lanes.append(o.get("lanes", 1))
            speed.append(spd * 1e9 if spd else np.nan)
            fec.append(fec_limit_for(o.get("type"), spd))
            cohorts.append(f"{o.get('part_number') or 'none'}|{int(spd) if spd else '?'}G|{d['role']}")
            th.append(o.get("thresholds"))
            if p.get("gpu") is not None:
                gpu_port[(di, int(p["gpu"]))] = i
    peer = np.full(len(names), -1, np.int64)
    for link in inv["links"]:
        a = pos[tuple(link["a"].split(":", 1))]
        b = pos[tuple(link["b"].split(":", 1))]
        peer[a], peer[b] = b, a
        ct = (link.get("cable") or {}).get("type")
        copper_ab = ct in ("dac", "aoc")
        while len(copper) < len(names):
            copper.append(False)
        copper[a] = copper[b] = copper_ab
    while len(copper) < len(names):
        copper.append(False)
    cn = sorted(set(cohorts))
    return Fabric(port_ids=np.arange(1, len(names) + 1), port_names=names, dev=np.asarray(dev), dev_names=dev_names,
                  dev_roles=dev_roles, peer=peer, n_lanes=np.asarray(lanes), speed_bps=np.asarray(speed, float),
                  cohort=np.asarray([cn.index(c) for c in cohorts]), cohort_names=cn,
                  fec_limit=np.asarray(fec, float), copper=np.asarray(copper, bool), th=thresholds_arrays(th),
                  gpu_port=gpu_port)


class Feed:
    """Run a scenario step by step, observe each frame, run a cycle every `cycle_steps` frames."""

    def __init__(self, spec: dict[str, Any], step: float = 60.0, config: Config | None = None) -> None:
        self.sc = Scenario.model_validate({"name": "t", **spec})
        inv = self.sc.inventory_source()
        from simulator.telemetry import resolve_inventory

        self.inv = resolve_inventory(inv)
        self.sim: FabricSim = make_sim(self.inv, self.sc, T0)
        self.fabric = fabric_from_inventory(self.inv)
        self.state = FeatureState(self.fabric, config)
        self.engine = Engine()
        self.step = step
        m = self.sim.m
        self.pmap = np.asarray([self._pos(m.port_dev_name[j], m.port_name[j]) for j in range(m.P)])
        self.t = T0

    def _pos(self, dev: str, port: str) -> int:
        if not hasattr(self, "_names"):
            self._names = {(self.fabric.dev_names[self.fabric.dev[i]], self.fabric.port_names[i]): i
                           for i in range(self.fabric.P)}
        return self._names[(dev, port)]

    def batch(self, frame: Any) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        out = {}
        m = self.sim.m
        for b in self.sim.blocks:
            if b.metric not in AXIS or b.metric not in frame.values:
                continue
            v = np.asarray(frame.values[b.metric], dtype=float)
            keep = frame.keep.get(b.metric)
            if b.gpu is not None:
                ports = np.asarray([self.fabric.gpu_port.get((int(d), int(g)), -1)
                                    for d, g in zip(b.gpu_dev, b.gpu, strict=True)])
                ts = frame.ts_ms[b.gpu_dev]
                idx = ports
            else:
                p = self.pmap[b.ports]
                ts = frame.ts_ms[m.dev[b.ports]]
                axis = AXIS[b.metric]
                idx = self.fabric.lane_index(p, b.lane) if axis == "lane" else p * NPRIO + PRIORITY \
                    if axis == "prio" else p
                if b.counter_bits is not None:
                    sat = b.saturating if b.saturating is not None else np.zeros(len(p), bool)
                    sel = b.counter_bits > 0
                    self.state.set_counter_meta(b.metric, idx[sel], b.counter_bits[sel], sat[sel])
            if keep is not None:
                idx, ts, v = idx[keep], ts[keep], v[keep]
            out[b.metric] = (idx, ts, v)
        return out

    def run(self, seconds: float, cycle_steps: int = 1) -> list[Finding]:
        """Advance `seconds` of data time; returns all findings of the cycles run."""
        found: list[Finding] = []
        for k, t in enumerate(timeline(self.t, self.t + seconds, self.step), 1):
            frame = self.sim.step(t, self.step)
            self.state.observe(self.batch(frame))
            if k % cycle_steps == 0:
                found += self.engine.run_cycle(self.state, int(round(t * 1000)))
        self.t += seconds
        return found
