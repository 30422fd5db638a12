"""Feed simulator frames straight into a FeatureState (no database): fast scenario tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from service.detection.engine import Engine
from service.detection.findings import Finding
from service.detection.state import AXIS, NPRIO, Config, Fabric, FeatureState, fec_limit_for, thresholds_arrays
from service.telemetry.catalogue import METRICS
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


Batch = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


class Recording:
    """A scenario simulated once at a fine step, then replayed at any poll cadence per metric group and any
    cycle step: counters (and state, FEC, pause, PCIe gauges) every `counters_s`, optics (DOM) every
    `optics_s`. Counters are cumulative, so a coarser poll of the same history is exact."""

    def __init__(self, spec: dict[str, Any], seconds: float, step: float = 10.0,
                 overlay: Callable[[float, Batch, Recording], None] | None = None) -> None:
        feed = Feed(spec, step=step)
        self.fabric, self.step, self.seconds = feed.fabric, step, seconds
        self.feed = feed
        self.frames: list[tuple[float, Batch]] = []
        for t in timeline(T0, T0 + seconds, step):
            b = feed.batch(feed.sim.step(t, step))
            if overlay is not None:
                overlay(t, b, self)
            self.frames.append((t, b))
        st = feed.state  # counter widths the simulator declared, to be set on every replay's state
        self.meta = {m: (np.flatnonzero(c.bits > 0), c.bits[c.bits > 0], c.sat[c.bits > 0])
                     for m, c in st.counters.items() if (c.bits > 0).any()}

    def port(self, dev: str, port: str) -> int:
        return self.feed._pos(dev, port)

    def replay(self, counters_s: float, optics_s: float, cycle_s: float, *, config: Config | None = None,
               drop: Iterable[str] = (), fabric: Fabric | None = None, lateness_s: float = 1.0,
               phase_s: float = 0.0, warm_until_s: float | None = None, late: float = 0.0, dup: float = 0.0,
               seed: int = 0, restart: bool = False, until_s: float | None = None) -> list[Finding]:
        """Feed each group's polls at its cadence and run a cycle every `cycle_s` (offset by `phase_s`, each
        `lateness_s` after its poll time, as live runs); returns every cycle's findings (the state is kept in
        `self.state`).

        `warm_until_s`: cycles every 60 s before this data time (a short cycle step is only needed around the
        faults). `late`/`dup`: that share of the samples arrives one poll late (after the cycle that should have
        seen it) / a second time. `restart`: save and restore the state after every cycle, as live does."""
        st = FeatureState(fabric or self.fabric, config)
        for m, (idx, bits, sat) in self.meta.items():
            st.set_counter_meta(m, idx, bits, sat)
        self.state = st
        eng = Engine()
        drop = set(drop)
        rng = np.random.default_rng(seed)
        held: Batch = {}
        out: list[Finding] = []
        for t, b in self.frames:
            k = round(t - T0)
            if until_s is not None and k > until_s:
                break
            batch = {m: v for m, v in b.items() if m not in drop
                     and k % round(optics_s if METRICS[m].group == "optics" else counters_s) == 0}
            if late or dup:
                batch = self._shuffle(batch, held, rng, late, dup)
            if batch:
                st.observe(batch)
            step = 60 if warm_until_s is not None and k < warm_until_s else cycle_s
            if (k - round(phase_s)) % round(step) == 0:
                out += eng.run_cycle(st, int(round((t + lateness_s) * 1000)))
                if restart:
                    st = self.state = FeatureState.from_bytes(st.to_bytes(), st.fabric, config)
        return out

    @staticmethod
    def _shuffle(batch: Batch, held: Batch, rng: np.random.Generator, late: float, dup: float) -> Batch:
        """Hold back a share of this poll's samples to the next one (late), add last poll's, repeat some."""
        out: Batch = {}
        for m in set(batch) | set(held):
            parts = [held.pop(m)] if m in held else []
            if m in batch:
                idx, ts, val = batch[m]
                back = rng.random(len(idx)) < late
                held[m] = (idx[back], ts[back], val[back])
                again = rng.random(len(idx)) < dup
                parts += [(idx[~back], ts[~back], val[~back]), (idx[again & ~back], ts[again & ~back],
                                                                 val[again & ~back])]
            out[m] = tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[assignment]
        return out
