"""An in-memory fabric graph from the inventory tables: hosts -> rail leaves -> spines -> cores, by pod.

Links are classified by the tiers of their ends: a switch's *uplinks* are its links to a
higher tier (leaf -> spine -> core); a *host link* joins a host NIC (with its rail) to a leaf.
Built with three set-based queries, so a 300k-port fabric loads in a few seconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from service.telemetry.store import newest_between

TIER = {"host": 0, "leaf": 1, "spine": 2, "core": 3}
FABRIC_POD = "(fabric)"  # pod name for links between pod-less devices (shared spines and cores)


@dataclass(frozen=True, slots=True)
class Device:
    id: int
    name: str
    role: str
    pod: str | None


@dataclass(frozen=True, slots=True)
class PortEnd:
    id: int
    device_id: int
    name: str
    rail: int | None


@dataclass(frozen=True, slots=True)
class Link:
    id: int
    lo: PortEnd     # lower tier end (the host on a host link, the leaf on a leaf-spine link)
    hi: PortEnd

    def ends(self) -> tuple[PortEnd, PortEnd]:
        return self.lo, self.hi


@dataclass
class Graph:
    devices: dict[int, Device] = field(default_factory=dict)
    by_name: dict[str, Device] = field(default_factory=dict)
    ports: dict[int, PortEnd] = field(default_factory=dict)
    links: dict[int, Link] = field(default_factory=dict)
    link_of_port: dict[int, int] = field(default_factory=dict)
    uplinks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))       # switch -> links up
    host_links: dict[tuple[int, int | None], list[int]] = field(default_factory=lambda: defaultdict(list))
    device_links: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # every link of a device
    leaf_rails: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))     # leaf -> rails served
    port_by_name: dict[tuple[int, str], PortEnd] = field(default_factory=dict)

    def device(self, name: str) -> Device | None:
        return self.by_name.get(name)

    def port(self, device: str, port: str) -> PortEnd | None:
        d = self.by_name.get(device)
        if d is None:
            return None
        return self.port_by_name.get((d.id, port))

    def link_pod(self, link_id: int) -> str:
        """The pod a link belongs to: its lower end's pod, else the upper end's, else the fabric."""
        link = self.links[link_id]
        for end in link.ends():
            pod = self.devices[end.device_id].pod
            if pod:
                return pod
        return FABRIC_POD

    def rail_leaves(self, pod: str | None, rail: int) -> list[int]:
        return [d for d, rails in self.leaf_rails.items() if rail in rails and self.devices[d].pod == pod]

    def label(self, end: PortEnd) -> str:
        return f"{self.devices[end.device_id].name}:{end.name}"


def load_graph(*, conn: Connection) -> Graph:
    """Build the graph from devices, ports and links."""
    g = Graph()
    for did, name, role, pod in conn.execute(text("SELECT id, name, role, pod FROM devices")):
        d = Device(did, name, role, pod)
        g.devices[did], g.by_name[name] = d, d
    for pid, did, name, rail in conn.execute(text("SELECT id, device_id, name, rail FROM ports")):
        g.ports[pid] = g.port_by_name[(did, name)] = PortEnd(pid, did, name, rail)
    for lid, a_id, b_id in conn.execute(text("SELECT id, a_port_id, b_port_id FROM links")):
        a, b = g.ports[a_id], g.ports[b_id]
        ta, tb = TIER[g.devices[a.device_id].role], TIER[g.devices[b.device_id].role]
        lo, hi = (a, b) if ta <= tb else (b, a)
        link = Link(lid, lo, hi)
        g.links[lid] = link
        g.link_of_port[a_id] = g.link_of_port[b_id] = lid
        g.device_links[a.device_id].append(lid)
        g.device_links[b.device_id].append(lid)
        lo_role, hi_role = g.devices[lo.device_id].role, g.devices[hi.device_id].role
        if lo_role == "host":
            g.host_links[(lo.device_id, lo.rail)].append(lid)
            if hi_role == "leaf" and lo.rail is not None:
                g.leaf_rails[hi.device_id].add(lo.rail)
        elif TIER[hi_role] > TIER[lo_role]:
            g.uplinks[lo.device_id].append(lid)
    return g


def down_links(*, conn: Connection, graph: Graph, at: datetime, lookback_s: float) -> set[int]:
    """Links with an end whose latest port_oper_up reading in the lookback is 0 (down now)."""
    port_of = dict(conn.execute(text(
        "SELECT id, port_id FROM series WHERE metric = 'port_oper_up' AND port_id IS NOT NULL")).all())
    newest: dict[int, tuple[int, float]] = {}  # port id -> its newest reading, of any of its series
    for sid, (ts_us, value) in newest_between(conn, at - timedelta(seconds=lookback_s), at, list(port_of)).items():
        port_id = port_of[sid]
        if port_id not in newest or ts_us > newest[port_id][0]:
            newest[port_id] = (ts_us, value)
    return {lid for port_id, (_, value) in newest.items()
            if value < 0.5 and (lid := graph.link_of_port.get(port_id)) is not None}


class FabricView:
    """The graph, and the links down at a time, each read once for every drain decision that shares them (a
    cycle's pages: each decision read both, over every port, so a cycle slowed by the fabric's size per page).
    A fresh view reads anew; one is only ever kept within a transaction."""

    def __init__(self) -> None:
        self._graph: Graph | None = None
        self._down: dict[tuple[datetime, float], frozenset[int]] = {}

    def graph(self, conn: Connection) -> Graph:
        if self._graph is None:
            self._graph = load_graph(conn=conn)
        return self._graph

    def down_links(self, conn: Connection, at: datetime, lookback_s: float) -> set[int]:
        """down_links at `at`: a new set each call (the caller adds the links its drains hold)."""
        if (at, lookback_s) not in self._down:
            self._down[(at, lookback_s)] = frozenset(
                down_links(conn=conn, graph=self.graph(conn), at=at, lookback_s=lookback_s))
        return set(self._down[(at, lookback_s)])
