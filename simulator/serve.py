"""A live simulated fabric on 127.0.0.1: the real collectors poll it as they would poll devices.

``serve_fabric`` builds a small fabric (or a scenario's), steps one FabricSim on a clock,
and after each step publishes the state through every protocol:

- SNMP v2c agents, one per switch (simulator/live_snmp.py);
- gNMI targets, one per switch (simulator/gnmi_target.py fed by simulator/live_gnmi.py);
- per-host sysfs trees and `ethtool` outputs (simulator/live_host.py).

Data time runs at ``start + elapsed * speedup`` so a demo can pass hours of a fault in
minutes. Collectors stamp samples with their own (wall) poll time, as against real
devices, so data time drives faults, workload and events, while the traffic counters grow
by the wall seconds each step stands for: a rate read against the stamps is physical at any
speedup. Between steps they climb smoothly (simulator/ramp.py). ``base_dir`` receives
``inventory.yaml`` (endpoints pointing at the live ports), ``ground_truth.json`` (with each
onset also in wall time) and ``hosts/<host>/``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.inventory.schemas import Inventory
from simulator.live_gnmi import switch_leaves
from simulator.live_host import HostTree
from simulator.live_snmp import SnmpAgents, switch_table
from simulator.ramp import Ramp, clock, settle
from simulator.scenarios import Scenario, load_scenario
from simulator.telemetry import EVENT_COUNTERS, FabricSim, Frame, make_sim, resolve_inventory
from simulator.topology import TopologyParams, write_inventory

COMMUNITY_ENV = "FW_SIM_COMMUNITY"
DEFAULT_COMMUNITY = "fabricwatch-sim"
# 2 rails x 1 leaf, 2 spines, 4 hosts with 2 NICs: 4 switches, 12 links, 24 ports.
SMALL = TopologyParams(shape="rail-optimized", hosts=4, gpus_per_host=2, nics_per_host=2, hosts_per_leaf=4,
                       spines=2, host_speed_gbps=400, fabric_speed_gbps=400, seed=7)
# how far back a ramp still answers for (simulator/live_snmp.py reads a walk at its start)
RAMP_HISTORY_S = 5.0
# which protocol the inventory names per switch role; every switch serves both
DEFAULT_PROTOCOLS = {"leaf": "snmp", "spine": "gnmi", "core": "gnmi"}


@dataclass
class PortView:
    """One port at one step: canonical values by metric (lane metrics by lane), plus static facts."""

    device: str
    port: str
    peer_device: str
    peer_port: str
    speed_bps: float
    dom: bool
    nic: str | None
    optic: dict[str, Any] | None
    values: dict[str, float | int] = field(default_factory=dict)
    lanes: dict[str, dict[int, float | int]] = field(default_factory=dict)
    bits: dict[str, int] = field(default_factory=dict)
    # while the clock runs: ramp times (this step last) and this port's values at the earlier points
    times: tuple[float, ...] = ()
    past: tuple[dict[str, float | int], ...] = ()
    lanes_past: tuple[dict[str, dict[int, float | int]], ...] = ()

    def counter(self, metric: str, lane: int | None = None, scale: float = 1.0) -> int | Ramp | None:
        """A counter as served (x `scale`): None if absent, a Ramp for a traffic counter while the clock
        runs, else the step's value."""
        def get(values: dict[str, float | int], lanes: dict[str, dict[int, float | int]]) -> float | int | None:
            x = values.get(metric) if lane is None else lanes.get(metric, {}).get(lane)
            return None if x is None or x != x else x  # absent or NaN

        now = get(self.values, self.lanes)
        if now is None:
            return None
        if not self.times or metric in EVENT_COUNTERS:
            return int(round(now * scale))
        points = [x for v, ln in zip(self.past, self.lanes_past, strict=True) if (x := get(v, ln)) is not None]
        if len(points) < len(self.past):  # not there at every point: served as it is
            return int(round(now * scale))
        return Ramp(self.times, tuple(int(round(x * scale)) for x in [*points, now]))


def frame_views(sim: FabricSim, frame: Frame, static: list[dict[str, Any]]) -> list[PortView]:
    """Every port's view of a frame (index = model port index); missing samples are left out."""
    views = [PortView(**s) for s in static]
    for b in sim.blocks:
        if b.gpu is not None or b.metric not in frame.values:
            continue
        vals = frame.values[b.metric].tolist()  # uint64 stays exact as Python int
        keep = frame.keep.get(b.metric)
        keep_l = keep.tolist() if keep is not None else None
        bits = b.counter_bits.tolist() if b.counter_bits is not None else None
        ports = b.ports.tolist()
        if b.lane is not None:  # lane metrics, port_fec_lane_errors_total included
            lanes = b.lane.tolist()
            for j, p in enumerate(ports):
                if keep_l is None or keep_l[j]:
                    views[p].lanes.setdefault(b.metric, {})[lanes[j]] = vals[j]
            continue
        for j, p in enumerate(ports):
            if keep_l is not None and not keep_l[j]:
                continue
            views[p].values[b.metric] = vals[j]
            if bits and bits[j]:
                views[p].bits[b.metric] = bits[j]
    return views


def _static(sim: FabricSim, inv: dict[str, Any]) -> list[dict[str, Any]]:
    m = sim.m
    port_info = {(d["name"], p["name"]): p for d in inv["devices"] for p in d.get("ports", [])}
    out = []
    for i in range(m.P):
        dev, port, peer = m.port_dev_name[i], m.port_name[i], int(m.peer[i])
        info = port_info.get((dev, port), {})
        out.append({"device": dev, "port": port, "peer_device": m.port_dev_name[peer], "peer_port": m.port_name[peer],
                    "speed_bps": float(m.speed_bps[i]), "dom": bool(m.dom[i]), "nic": info.get("nic"),
                    "optic": info.get("optic")})
    return out


class LiveFabric:
    """A running live fabric. Use as a context manager; ``close`` stops every server and thread."""

    def __init__(self, scenario: Scenario | None, inv: dict[str, Any], *, start: float, speedup: float,
                 base_dir: Path, snmp: bool, gnmi: bool, host: bool, tick_s: float | None,
                 community: str, poll_interval_s: float | None, protocols: dict[str, str],
                 host_root: Path | None = None) -> None:
        self.scenario = scenario
        self.inv = inv
        self.start, self.speedup = start, speedup
        self.base_dir = Path(base_dir)
        self.tick_s = tick_s
        self.community = community
        self.host_root = Path(host_root) if host_root is not None else self.base_dir / "hosts"
        self.sim = make_sim(inv, scenario, start)
        self.model = self.sim.m
        self._static = _static(self.sim, inv)
        roles = {d["name"]: d["role"] for d in inv["devices"]}
        names = list(self.model.dev_names)
        self.switches = [d for d in names if roles[d] != "host" and len(self.model.device_ports(d))]
        self.hosts = [d for d in names if roles[d] == "host" and len(self.model.device_ports(d))]
        self._dev_ports = {d: self.model.device_ports(d).tolist() for d in self.switches + self.hosts}
        self.snmp_ports: dict[str, int] = {}
        self.gnmi_ports: dict[str, int] = {}
        self.host_dirs: dict[str, Path] = {}
        self.step_costs: list[float] = []  # seconds per step: sim + render + publish
        self.views: list[PortView] = []
        self._want = (snmp, gnmi, host)
        self._protocols = protocols
        self._poll_interval_s = poll_interval_s
        self._leaves: dict[str, dict[str, Any]] = {d: {} for d in self.switches}
        self._trees: dict[str, HostTree] = {}
        self._agents: SnmpAgents | None = None
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clock: threading.Thread | None = None
        self._offset = 0.0
        self._t: float | None = None
        self._wall0 = clock()
        # while the clock runs: the points (ramp-clock time, views) the traffic counters climb through, and
        # how far behind the steps the climbs run, so a step that costs more than the last one finds its
        # predecessor's climb still going (steps 1 s apart may then take up to 1 s together, unnoticed)
        self._ramp_points: list[tuple[float, list[PortView]]] = []
        self._ramp_lag = 2 * tick_s if tick_s else 0.0
        self._ramp_at = 0.0
        self._publish_costs: list[float] = [0.0]  # seconds from a step's ramp to the end of its publishing
        self.wall_start = time.time()
        self._uptime0 = time.monotonic()
        self._last_oper: dict[tuple[str, str], bool] = {}
        self._last_change: dict[str, dict[str, int]] = {d: {} for d in self.switches}
        self.inventory_path = self.base_dir / "inventory.yaml"
        self.truth_path = self.base_dir / "ground_truth.json"

    # -- lifecycle

    def open(self) -> LiveFabric:
        from simulator.gnmi_target import serve_gnmi

        snmp, gnmi, host = self._want
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            if snmp and self.switches:
                self._agents = SnmpAgents(self.switches, self.community)
                self._agents.start()
                self._stack.callback(self._agents.stop)
                self.snmp_ports = dict(self._agents.ports)
            if gnmi:
                for d in self.switches:
                    port, _ = self._stack.enter_context(
                        serve_gnmi(lambda d=d: self._served_leaves(d), max_workers=8))
                    self.gnmi_ports[d] = port
            if host:
                for h in self.hosts:
                    tree = HostTree(self.host_root / h)
                    tree.install_shim()
                    self._trees[h] = tree
                    self.host_dirs[h] = tree.root
            first = max(self.tick_s or 1.0, 1.0) * self.speedup  # the first interval ends at `start`
            self._step(self.start, first, first / self.speedup, at=self._wall0 if self.tick_s else None)
            self._write_inventory()
            self._write_truth()
            if self.tick_s:
                self._clock = threading.Thread(target=self._run_clock, name="fw-sim-clock", daemon=True)
                self._clock.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self._stop.set()
        if self._clock is not None:
            self._clock.join(10)
            self._clock = None
        self._stack.close()

    def __enter__(self) -> LiveFabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- time

    def data_time(self, at: float | None = None) -> float:
        """Data time at ramp-clock time `at` (default now)."""
        now = clock() if at is None else at
        return self.start + (now - self._wall0) * self.speedup + self._offset

    @property
    def t(self) -> float | None:
        """Data time of the latest step."""
        return self._t

    def advance(self, data_seconds: float) -> Frame:
        """Step now, `data_seconds` of data time after the last step (tests, manual demos).

        Counters grow by `data_seconds / speedup` seconds of traffic and are served at once."""
        with self._lock:
            assert self._t is not None
            self._offset += data_seconds  # keep the clock from stepping back over this interval
            return self._step_locked(self._t + data_seconds, data_seconds, data_seconds / self.speedup)

    def _run_clock(self) -> None:
        assert self.tick_s
        while not self._stop.wait(self.tick_s):
            with self._lock:
                now = clock()
                t = self.data_time(now)
                if self._t is not None and t - self._t >= 1e-3:
                    # counters carry the wall seconds since the last step, at the rates of its data time
                    self._step_locked(t, t - self._t, (t - self._t) / self.speedup, at=now)

    def _step(self, t: float, dt: float, span: float, at: float | None = None) -> Frame:
        with self._lock:
            return self._step_locked(t, dt, span, at)

    # -- one step, published everywhere

    def _step_locked(self, t: float, dt: float, span: float, at: float | None = None) -> Frame:
        """One step: `dt` data seconds of physics, counters grown by `span` seconds of traffic.

        `at`: the ramp-clock time the step stands for (the clock's steps): its traffic counters are
        served climbing over `span` seconds. None (a manual step): served at once.
        """
        t0 = time.perf_counter()
        frame = self.sim.step(t, dt, span)
        self._t = t
        views = frame_views(self.sim, frame, self._static)
        ramped = clock()
        self._ramp(views, span, at, ramped)
        self.views = views
        ticks = int((time.monotonic() - self._uptime0) * 100)
        for d in self.switches:
            pv = [views[i] for i in self._dev_ports[d]]
            for v in pv:
                up = (v.values.get("port_oper_up") or 0) > 0.5
                if self._last_oper.get((d, v.port)) not in (None, up):
                    self._last_change[d][v.port] = ticks
                self._last_oper[(d, v.port)] = up
            if self._agents is not None:
                self._agents.publish(d, switch_table(d, pv, uptime_ticks=ticks, last_change=self._last_change[d]))
            if self.gnmi_ports:
                self._leaves[d] = switch_leaves(pv)
        for h, tree in self._trees.items():
            tree.write([views[i] for i in self._dev_ports[h]])
        self._publish_costs = [*self._publish_costs[-7:], clock() - ramped]
        self.step_costs.append(time.perf_counter() - t0)
        return frame

    def _ramp(self, views: list[PortView], span: float, at: float | None, now: float) -> None:
        """Give each view its ramp: a climb of `span` seconds up to this step's values, `_ramp_lag` after
        the step before it was taken, but never before the climb still going ends, nor before this step
        is published everywhere (until then the previous ramp is served, flat past its end: twice the
        longest recent publishing is allowed for). So nothing already served changes and a counter does
        not jump, however late a step comes; a late step only leaves a flat stretch. `at` None (a
        manual step): served at once."""
        points = self._ramp_points
        if at is None or not points:
            points[:] = [(now, views)]
            self._ramp_at = at or 0.0
            if at is None:
                return
        else:
            start = max(points[-1][0], now + 2 * max(self._publish_costs), self._ramp_at + self._ramp_lag)
            self._ramp_at = at
            if start > points[-1][0]:
                points.append((start, points[-1][1]))  # the flat stretch since the last climb ended
            points.append((start + span, views))
            while len(points) > 1 and points[1][0] <= now - RAMP_HISTORY_S:
                del points[0]  # read no more (an SNMP walk reads at its start: a few seconds back at most)
        times = tuple(p[0] for p in points)
        for i, v in enumerate(views):
            v.times = times
            v.past = tuple(p[1][i].values for p in points[:-1])
            v.lanes_past = tuple(p[1][i].lanes for p in points[:-1])

    def _served_leaves(self, device: str) -> dict[str, Any]:
        """A switch's gNMI leaves as of now: ramped counters read off the clock."""
        now = clock()
        return {k: settle(v, now) for k, v in self._leaves[device].items()}

    def view(self, device: str, port: str) -> PortView:
        """The latest published state of one port (what the endpoints serve now)."""
        return self.views[self.model.port(device, port)]

    # -- files for the service

    def _endpoints(self, device: str, role: str) -> list[dict[str, Any]]:
        iv = self._poll_interval_s
        common: dict[str, Any] = {"address": "127.0.0.1", "timeout_s": 2.0}
        if iv:
            common["intervals"] = {"counters": iv, "optics": iv, "state": iv}
        if role == "host":
            if device in self.host_dirs:
                return [{"protocol": "host", **common, "sysfs_root": str(self.host_dirs[device]),
                         "ethtool": str(self.host_dirs[device] / "bin" / "ethtool")}]
            return []
        want = self._protocols.get(role, "snmp")
        if want == "snmp" and device not in self.snmp_ports:
            want = "gnmi"
        if want == "gnmi" and device not in self.gnmi_ports:
            want = "snmp"
        if want == "snmp" and device in self.snmp_ports:
            return [{"protocol": "snmp", **common, "port": self.snmp_ports[device], "version": "2c",
                     "community": {"env": COMMUNITY_ENV}}]
        if want == "gnmi" and device in self.gnmi_ports:
            return [{"protocol": "gnmi", **common, "port": self.gnmi_ports[device], "tls": {"enabled": False}}]
        return []

    def _write_inventory(self) -> None:
        inv = json.loads(json.dumps(self.inv))  # a copy; the model keeps the original
        for d in inv["devices"]:
            eps = self._endpoints(d["name"], d["role"])
            if eps:
                d["endpoints"] = eps
        Inventory.model_validate(inv)  # the service must accept what we write
        write_inventory(inv, self.inventory_path)

    def wall_time(self, data_t: float) -> float:
        """When (Unix wall time) the clock reaches data time `data_t`."""
        return self.wall_start + (data_t - self.start - self._offset) / self.speedup

    def _write_truth(self) -> None:
        events = self.scenario.ground_truth(self.model) if self.scenario is not None else []
        for e in events:
            for k in ("onset", "hard_failure"):
                v = e.get(f"{k}_unix")
                e[f"{k}_wall_unix"] = self.wall_time(v) if v is not None and np.isfinite(v) else None
        truth = {"scenario": self.scenario.name if self.scenario else None,
                 "seed": self.sim.seed, "start": self.start, "speedup": self.speedup,
                 "wall_start": self.wall_start, "inventory_file": self.inventory_path.name,
                 "note": "onset_unix is data time; *_wall_unix is when the live clock reaches it",
                 "events": events}
        self.truth_path.write_text(json.dumps(truth, indent=2))

    def summary(self) -> dict[str, Any]:
        return {"inventory": str(self.inventory_path), "ground_truth": str(self.truth_path),
                "community_env": COMMUNITY_ENV, "community": self.community,
                "snmp": self.snmp_ports, "gnmi": self.gnmi_ports,
                "hosts": {h: str(p) for h, p in self.host_dirs.items()},
                "start": self.start, "speedup": self.speedup, "tick_s": self.tick_s}


def serve_fabric(scenario_or_params: Scenario | str | Path | TopologyParams | None = None, *,
                 start: float | None = None, speedup: float = 1.0, base_dir: str | Path,
                 snmp: bool = True, gnmi: bool = True, host: bool = True, tick_s: float | None = 1.0,
                 community: str = DEFAULT_COMMUNITY, poll_interval_s: float | None = None,
                 protocols: dict[str, str] | None = None, host_root: str | Path | None = None) -> LiveFabric:
    """Start a live fabric and return it running (a context manager; leaving it stops everything).

    `scenario_or_params`: a Scenario, a scenario file, TopologyParams, or None for SMALL.
    `start`: data time of the first step (Unix s; default now). `tick_s`: wall seconds between
    steps, None for manual stepping with ``advance``. `protocols`: role -> "snmp" | "gnmi" for
    the endpoint the inventory names (both are served for every switch). `host_root`: where the
    host trees go (default base_dir/hosts); a tmpfs such as /dev/shm makes a step several times
    cheaper, because ext4 flushes data on every rename-over-existing-file (auto_da_alloc).
    """
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    sc: Scenario | None
    if isinstance(scenario_or_params, str | Path):
        sc = load_scenario(scenario_or_params)
    elif isinstance(scenario_or_params, Scenario):
        sc = scenario_or_params
    else:
        sc = None
    source = sc.inventory_source() if sc is not None else (scenario_or_params or SMALL)
    inv = resolve_inventory(source)
    live = LiveFabric(sc, inv, start=time.time() if start is None else float(start), speedup=speedup,
                      base_dir=Path(base_dir), snmp=snmp, gnmi=gnmi, host=host, tick_s=tick_s,
                      community=community, poll_interval_s=poll_interval_s,
                      protocols={**DEFAULT_PROTOCOLS, **(protocols or {})},
                      host_root=Path(host_root) if host_root is not None else None)
    return live.open()
