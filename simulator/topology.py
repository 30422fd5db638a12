"""Fabric topology generator: parameters in, an inventory (schemas.Inventory) out.

Three shapes:
- ``rail-optimized``: NIC i of every host plugs into a leaf of rail i in its pod; leaves
  uplink to one spine layer shared by all pods.
- ``two-tier``: every NIC of a host plugs into the same leaf (classic ToR); leaves uplink
  to the shared spine layer.
- ``three-tier``: rail-optimized pods, each with its own spines; every spine uplinks to
  every core.

The builder works on plain dicts because pydantic objects for 100k GPUs cost seconds
and YAML writing from dicts (CSafeDumper, shared threshold anchors) is the fast path;
``build_topology`` validates the same dict into an ``Inventory``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.inventory.schemas import Inventory
from simulator import optics

Shape = Literal["rail-optimized", "two-tier", "three-tier"]

DEFAULT_MIX: dict[int, dict[str, float]] = {
    # host links are short in-row runs; fabric links mix reaches (DR for in-hall, FR across halls)
    100: {"100G-SR4": 0.6, "100G-CWDM4": 0.4},
    400: {"400G-DR4": 0.8, "400G-FR4": 0.1, "400G-AOC": 0.07, "400G-DAC": 0.03},
    800: {"800G-DR8": 0.6, "800G-2xFR4": 0.35, "800G-DAC": 0.05},
}
SWITCH_MODEL = {100: ("Arista", "7060CX-32S"), 400: ("Arista", "7060DX5-64S"), 800: ("NVIDIA", "SN5600")}


class TopologyParams(BaseModel):
    """What fabric to build. Counts of leaves and spines are per pod for three-tier."""

    model_config = ConfigDict(extra="forbid")

    shape: Shape = "rail-optimized"
    hosts: int = Field(default=4, ge=1, le=200_000)
    gpus_per_host: int = Field(default=8, ge=0, le=64)
    nics_per_host: int = Field(default=8, ge=1, le=64)
    rails: int | None = Field(default=None, ge=1, description="defaults to nics_per_host")
    pods: int = Field(default=1, ge=1, le=1024)
    hosts_per_leaf: int = Field(default=32, ge=1, description="host-facing ports per leaf (per rail)")
    leaves: int | None = Field(default=None, ge=1, description="leaves per pod; derived when unset")
    spines: int | None = Field(default=None, ge=1, description="spine count (per pod for three-tier)")
    uplinks_per_leaf: int | None = Field(default=None, ge=1, description="defaults to one per spine")
    cores: int = Field(default=4, ge=1, description="three-tier only")
    host_speed_gbps: Literal[100, 400, 800] = 400
    fabric_speed_gbps: Literal[100, 400, 800] = 800
    optics_mix: dict[str, float] = Field(default_factory=dict,
                                         description="module type -> weight; per tier, types of that speed")
    port_style: Literal["ethernet", "swp"] = "ethernet"
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> TopologyParams:
        for t in self.optics_mix:
            optics.spec(t)
        if self.hosts < self.pods:
            raise ValueError("need at least one host per pod")
        if self.shape != "two-tier" and self.leaves is not None and self.leaves % self.n_rails:
            raise ValueError(f"leaves per pod ({self.leaves}) must be a multiple of rails ({self.n_rails})")
        return self

    @property
    def n_rails(self) -> int:
        return self.rails or self.nics_per_host


def _port_name(style: str, n: int) -> str:
    return f"swp{n}" if style == "swp" else f"Ethernet1/{n}"


class _Builder:
    def __init__(self, p: TopologyParams) -> None:
        self.p = p
        self.rng = np.random.default_rng([p.seed, 0x70])
        self.devices: list[dict[str, Any]] = []
        self.links: list[dict[str, Any]] = []
        self._next_port: dict[str, int] = {}
        self._ports: dict[str, list[dict[str, Any]]] = {}
        self._serial = int(self.rng.integers(10**7, 9 * 10**7))

    def device(self, name: str, kind: str, role: str, pod: str | None, speed: int, gpus: int = 0) -> str:
        ports: list[dict[str, Any]] = []
        d: dict[str, Any] = {"name": name, "kind": kind, "role": role}
        if pod:
            d["pod"] = pod
        if kind == "switch":
            d["vendor"], d["model"] = SWITCH_MODEL[speed]
        else:
            d["vendor"], d["model"], d["gpus"] = "Supermicro", "SYS-821GE-TNHR", gpus
        d["ports"] = ports
        self.devices.append(d)
        self._ports[name] = ports
        self._next_port[name] = 1
        return name

    def switch_port(self, dev: str, speed: int) -> dict[str, Any]:
        n = self._next_port[dev]
        self._next_port[dev] = n + 1
        port = {"name": _port_name(self.p.port_style, n), "speed_gbps": speed}
        self._ports[dev].append(port)
        return port

    def host_port(self, dev: str, i: int, speed: int) -> dict[str, Any]:
        port: dict[str, Any] = {"name": f"eth{i}", "speed_gbps": speed, "rail": i % self.p.n_rails,
                                "nic": f"mlx5_{i}"}
        if i < self.p.gpus_per_host:
            port["gpu"] = i
        self._ports[dev].append(port)
        return port

    def mix(self, speed: int) -> tuple[list[str], np.ndarray]:
        user = {t: w for t, w in self.p.optics_mix.items() if optics.spec(t).speed_gbps == speed and w > 0}
        mix = user or DEFAULT_MIX[speed]
        types = list(mix)
        w = np.array([mix[t] for t in types], dtype=float)
        return types, w / w.sum()

    def cable(self, a: tuple[str, dict], b: tuple[str, dict], type_: str, length: float) -> None:
        m = optics.spec(type_)
        s = self._serial
        self._serial += 2
        parts = m.parts
        va, pa = parts[s % len(parts)]
        if m.cable in ("aoc", "dac"):  # one assembly, both ends the same part
            vb, pb = va, pa
            sa, sb = f"{va[:2].upper()}{s:08d}A", f"{va[:2].upper()}{s:08d}B"
        else:
            vb, pb = parts[(s // 7) % len(parts)]
            sa, sb = f"{va[:2].upper()}{s:08d}", f"{vb[:2].upper()}{s + 1:08d}"
        th = optics.thresholds_dict(type_)
        for (_, port), vendor, part, serial in ((a, va, pa, sa), (b, vb, pb, sb)):
            port["optic"] = {"vendor": vendor, "part_number": part, "serial": serial, "type": m.type,
                             "form_factor": m.form_factor, "lanes": m.lanes, "thresholds": th}
        self.links.append({"a": f"{a[0]}:{a[1]['name']}", "b": f"{b[0]}:{b[1]['name']}",
                           "cable": {"type": m.cable, "length_m": length}})

    def build(self) -> dict[str, Any]:
        p = self.p
        rails = p.n_rails
        per_pod = [len(c) for c in np.array_split(np.arange(p.hosts), p.pods)]
        host_types, host_w = self.mix(p.host_speed_gbps)
        fab_types, fab_w = self.mix(p.fabric_speed_gbps)
        pods = [f"p{i + 1}" for i in range(p.pods)]
        three = p.shape == "three-tier"
        leaves_by_pod: list[list[str]] = []
        host_links: list[tuple[tuple[str, dict], str]] = []  # (host end, leaf name)
        h_global = 0
        for pi, pod in enumerate(pods):
            n_hosts = per_pod[pi]
            if p.shape == "two-tier":
                n_leaves = p.leaves or math.ceil(n_hosts * p.nics_per_host / p.hosts_per_leaf)
                hosts_per_leaf = math.ceil(n_hosts / n_leaves)
                leaves = [self.device(f"leaf-{pod}-{j + 1:02d}", "switch", "leaf", pod, p.fabric_speed_gbps)
                          for j in range(n_leaves)]
            else:
                per_rail = (p.leaves // rails) if p.leaves else math.ceil(n_hosts / p.hosts_per_leaf)
                hosts_per_leaf = math.ceil(n_hosts / per_rail)
                leaves = [self.device(f"leaf-{pod}-r{r}-{j + 1:02d}", "switch", "leaf", pod,
                                      p.fabric_speed_gbps)
                          for r in range(rails) for j in range(per_rail)]
            leaves_by_pod.append(leaves)
            for h in range(n_hosts):
                h_global += 1
                host = self.device(f"host-{pod}-{h_global:05d}", "host", "host", pod, p.host_speed_gbps,
                                   p.gpus_per_host)
                group = h // hosts_per_leaf
                for i in range(p.nics_per_host):
                    port = self.host_port(host, i, p.host_speed_gbps)
                    leaf = leaves[min(group, len(leaves) - 1)] if p.shape == "two-tier" else \
                        leaves[(i % rails) * (len(leaves) // rails) + group]
                    host_links.append(((host, port), leaf))
        # host links: one module type per link, drawn from the host mix
        choice = self.rng.choice(len(host_types), size=len(host_links), p=host_w)
        lengths = np.round(self.rng.uniform(2, 30, size=len(host_links)), 1)
        for k, (hend, leaf) in enumerate(host_links):
            t = host_types[choice[k]]
            length = min(float(lengths[k]), optics.spec(t).reach_m)
            self.cable(hend, (leaf, self.switch_port(leaf, p.host_speed_gbps)), t, length)
        # spine layer
        all_leaves = [leaf for ls in leaves_by_pod for leaf in ls]
        fab: list[tuple[str, str]] = []
        if three:
            spines_by_pod = []
            for pi, pod in enumerate(pods):
                n_sp = p.spines or max(2, math.ceil(len(leaves_by_pod[pi]) / 4))
                sp = [self.device(f"spine-{pod}-{j + 1:02d}", "switch", "spine", pod, p.fabric_speed_gbps)
                      for j in range(n_sp)]
                spines_by_pod.append(sp)
                fab += self._uplinks(leaves_by_pod[pi], sp)
            cores = [self.device(f"core-{j + 1:02d}", "switch", "core", None, p.fabric_speed_gbps)
                     for j in range(p.cores)]
            fab += [(s, c) for sp in spines_by_pod for s in sp for c in cores]
        else:
            n_sp = p.spines or max(2, min(64, math.ceil(len(all_leaves) / 4)))
            sp = [self.device(f"spine-{j + 1:02d}", "switch", "spine", None, p.fabric_speed_gbps)
                  for j in range(n_sp)]
            fab += self._uplinks(all_leaves, sp)
        choice = self.rng.choice(len(fab_types), size=len(fab), p=fab_w)
        lengths = np.round(self.rng.uniform(10, 300, size=len(fab)), 1)
        for k, (lo, hi) in enumerate(fab):
            t = fab_types[choice[k]]
            length = min(float(lengths[k]), optics.spec(t).reach_m)
            self.cable((lo, self.switch_port(lo, p.fabric_speed_gbps)),
                       (hi, self.switch_port(hi, p.fabric_speed_gbps)), t, length)
        return {"version": 1, "pods": [{"name": x} for x in pods], "devices": self.devices,
                "links": self.links}

    def _uplinks(self, leaves: list[str], spines: list[str]) -> list[tuple[str, str]]:
        n_up = self.p.uplinks_per_leaf or len(spines)
        return [(leaf, spines[k % len(spines)]) for leaf in leaves for k in range(n_up)]


def build_topology_dict(params: TopologyParams) -> dict[str, Any]:
    """The inventory as plain dicts (the fast path for big fabrics)."""
    return _Builder(params).build()


def build_topology(params: TopologyParams) -> Inventory:
    """The inventory, validated by schemas.Inventory."""
    return Inventory.model_validate(build_topology_dict(params))


def inventory_dict(inv: Inventory | dict[str, Any]) -> dict[str, Any]:
    return inv if isinstance(inv, dict) else inv.model_dump(exclude_none=True)


_PLAIN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9._/\-]*$")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}


def _scalar(v: Any) -> str:
    if isinstance(v, str):
        return v if _PLAIN_RE.match(v) and v.lower() not in _YAML_WORDS else json.dumps(v)
    return json.dumps(v)


def write_inventory(inv: Inventory | dict[str, Any], path: str | Path) -> Path:
    """Write inventory YAML: block style for devices, one flow line per port and per link.

    PyYAML's representer runs in Python and needs over a minute for 100k GPUs; this
    writer emits the same data (JSON lines are YAML flow mappings) in a few seconds and
    keeps one port per line, which is also easy to grep.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d = inventory_dict(inv)
    th_cache: dict[int, str] = {}
    with path.open("w") as f:
        w = f.write
        w(f"version: {d.get('version', 1)}\n")
        w("pods:\n" if d.get("pods") else "pods: []\n")
        for pod in d.get("pods", []):
            w(f"- {json.dumps(pod)}\n")
        w("devices:\n" if d.get("devices") else "devices: []\n")
        for dev in d.get("devices", []):
            first = True
            for k, v in dev.items():
                if k == "ports":
                    continue
                val = json.dumps(v) if isinstance(v, list | dict) else _scalar(v)
                w(("- " if first else "  ") + f"{k}: {val}\n")
                first = False
            ports = dev.get("ports", [])
            w("  ports:\n" if ports else "  ports: []\n")
            for port in ports:
                opt = port.get("optic")
                th = opt.get("thresholds") if opt else None
                if th is None:
                    w(f"  - {json.dumps(port)}\n")
                    continue
                tkey = id(th)  # shared threshold blocks: written once with an anchor, then aliased
                ts = th_cache.get(tkey)
                if ts is None:
                    anchor = f"th{len(th_cache) + 1}"
                    th_cache[tkey] = f"*{anchor}"
                    ts = f"&{anchor} {json.dumps(th)}"
                body = {k: v for k, v in port.items() if k != "optic"}
                o = {k: v for k, v in opt.items() if k != "thresholds"}
                w(f"  - {json.dumps(body)[:-1]}, \"optic\": {json.dumps(o)[:-1]}, \"thresholds\": {ts}}}}}\n")
        w("links:\n" if d.get("links") else "links: []\n")
        for link in d.get("links", []):
            w(f"- {json.dumps(link)}\n")
    return path


def read_inventory(path: str | Path) -> Inventory:
    with Path(path).open() as f:
        return Inventory.model_validate(yaml.load(f, Loader=yaml.CSafeLoader))
