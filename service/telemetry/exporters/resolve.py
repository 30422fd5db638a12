"""Port identity against the inventory: which device an exporter's `instance` (or Hostname, or gnmic
`source`) is, and which of its ports `device="mlx5_0"` / `ifName="Ethernet1"` / `interface_name` is.

A host label value (`10.0.1.1:9100`, `gpu-a01`, `gpu-a01.cluster.local:9400`) names a device by,
in order: an endpoint with that address and port; a device of that name (or of the first DNS label
of it); a device whose management address, or one of whose endpoints' addresses, is that host.
Where several devices match, those of the exporter's kind (hosts for node_exporter and
dcgm-exporter, switches for snmp_exporter and gnmic) are kept; still several is ambiguous.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection, text

from service.telemetry.exporters.base import DeviceKind, PortBy, Reason

_FINGERPRINT_SQL = """
SELECT (SELECT count(*) FROM devices), (SELECT max(updated_at) FROM devices),
       (SELECT count(*) FROM ports), (SELECT coalesce(max(id), 0) FROM ports),
       (SELECT count(*) FROM endpoints), (SELECT coalesce(max(id), 0) FROM endpoints)
"""


def split_host(value: str) -> tuple[str, int | None]:
    """`host[:port]`, `[v6]:port` or a URL -> (host, port)."""
    v = value.strip()
    if "://" in v:
        parts = urlsplit(v)
        return parts.hostname or "", parts.port
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if v.count(":") == 1:
        host, _, port = v.partition(":")
        return host, int(port) if port.isdigit() else None
    return v, None


@dataclass
class InventoryIndex:
    """Devices, their addresses and ports, read from the database in one go (`load`)."""

    kinds: dict[str, str] = field(default_factory=dict)  # device name -> kind
    by_endpoint: dict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    by_address: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    ports: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # device -> port names
    by_nic: dict[str, dict[str, list[str]]] = field(default_factory=lambda: defaultdict(dict))  # dev -> nic -> ports
    fingerprint: tuple[Any, ...] = ()
    loaded_at: float = 0.0

    @classmethod
    def load(cls, conn: Connection) -> InventoryIndex:
        idx = cls(fingerprint=tuple(conn.execute(text(_FINGERPRINT_SQL)).one()), loaded_at=time.monotonic())
        names: dict[int, str] = {}
        for dev_id, name, kind, mgmt in conn.execute(text("SELECT id, name, kind, mgmt_address FROM devices")):
            names[dev_id] = name
            idx.kinds[name] = kind
            if mgmt:
                idx.by_address[split_host(mgmt)[0].lower()].add(name)
        for dev_id, address, port in conn.execute(text("SELECT device_id, address, port FROM endpoints")):
            host = split_host(address)[0].lower()
            idx.by_address[host].add(names[dev_id])
            if port is not None:
                idx.by_endpoint[(host, port)].add(names[dev_id])
        for dev_id, name, nic in conn.execute(text("SELECT device_id, name, nic FROM ports")):
            dev = names[dev_id]
            idx.ports[dev].add(name)
            if nic:
                nic_name, _, num = nic.partition("/")
                idx.by_nic[dev].setdefault(nic_name, []).append(name)
                if num:
                    idx.by_nic[dev].setdefault(nic, []).append(name)
        return idx

    def stale(self, conn: Connection) -> bool:
        return tuple(conn.execute(text(_FINGERPRINT_SQL)).one()) != self.fingerprint

    def device(self, hosts: tuple[str, ...], kind: DeviceKind | None, *, exact: bool = False
               ) -> tuple[str | None, Reason | None, str]:
        """(device, None, "") or (None, reason, the value that did not resolve)."""
        if exact:
            return (hosts[0], None, "") if hosts[0] in self.kinds else (None, Reason.UNKNOWN_INSTANCE, hosts[0])
        for value in hosts:
            host, port = split_host(value)
            host_l = host.lower()
            found: set[str] = set()
            if port is not None:
                found = self.by_endpoint.get((host_l, port), set())
            if not found:
                for n in (host, host.split(".", 1)[0]):
                    if n in self.kinds:
                        found = {n}
                        break
            if not found:
                found = self.by_address.get(host_l, set())
            if len(found) > 1 and kind is not None:
                found = {d for d in found if self.kinds[d] == kind.value} or found
            if len(found) == 1:
                return next(iter(found)), None, ""
            if len(found) > 1:
                return None, Reason.AMBIGUOUS_INSTANCE, f"{value} ({', '.join(sorted(found)[:4])})"
        return None, Reason.UNKNOWN_INSTANCE, hosts[-1] if hosts else "(no instance label)"

    def port(self, device: str, ref: tuple[str, ...]) -> str | None:
        """The inventory port an exporter's port reference names, or None."""
        how, value = ref[0], ref[1]
        names = self.ports.get(device, set())
        if how == PortBy.NIC:
            num = ref[2] if len(ref) > 2 else ""
            nics = self.by_nic.get(device, {})
            hit = (nics.get(f"{value}/{num}") if num else None) or nics.get(value)
            if hit and len(hit) == 1:
                return hit[0]
            return value if value in names else None
        if how == PortBy.IFNAME:
            descr = ref[2] if len(ref) > 2 else ""
            for cand in (value, descr):
                if cand and cand in names:
                    return cand
            return None
        return value if value in names else None
