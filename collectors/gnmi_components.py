"""Which port a transceiver belongs to, read from the openconfig component tree.

A transceiver's DOM arrives keyed by its *component* name (`transceiver-Ethernet8`,
`Ethernet49 transceiver`, `Ethernet-1/31-transceiver`), never by the interface name the
inventory knows. openconfig ties the two, in order of preference:

1. `/interfaces/interface[name=I]/state/transceiver = C` (openconfig-platform-transceiver):
   the interface names its transceiver directly;
2. `/interfaces/interface[name=I]/state/hardware-port = P` (openconfig-platform-port) with
   `/components/component[name=C]/state/parent = P`, or P listing C under
   `subcomponents/subcomponent`: the transceiver sits in the port I runs on.

Only when the device sends none of that do we fall back to the component name: the patterns
NOSes use are one table (NAME_PATTERNS), and a name that fits none is reported, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from collectors.gnmi_decode import Leaf

# Slow-changing leaves that carry the tie; read at the start of every poll and stream.
TIE_PATHS = (
    "/interfaces/interface/state/hardware-port",
    "/interfaces/interface/state/transceiver",
    "/components/component/state/parent",
    "/components/component/state/type",
    "/components/component/subcomponents/subcomponent/state/name",
)

# Component name -> interface name, per NOS convention; the first group is the interface.
NAME_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("transceiver-X (SONiC)", re.compile(r"^transceiver[-_ ]?(.+)$", re.IGNORECASE)),
    ("X transceiver (EOS)", re.compile(r"^(.+?)\s+transceiver$", re.IGNORECASE)),
    ("X-transceiver (SR Linux)", re.compile(r"^(.+?)[-_]transceiver$", re.IGNORECASE)),
    ("xcvr-X", re.compile(r"^xcvr[-_ ]?(.+)$", re.IGNORECASE)),
    ("X-xcvr", re.compile(r"^(.+?)[-_ ]xcvr$", re.IGNORECASE)),
    ("Xcvr for X", re.compile(r"^xcvr for (.+)$", re.IGNORECASE)),
)


def _name_port(component: str) -> str | None:
    for _, pat in NAME_PATTERNS:
        m = pat.match(component.strip())
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


def _value(v: object) -> str | None:
    if not isinstance(v, str):
        return None
    s = v.strip().strip('"').strip()
    return s.rsplit(":", 1)[-1] if s.startswith("openconfig-") else s or None


@dataclass(slots=True)
class PortTies:
    """What the device said about its components and interfaces; answers `port_of(component)`."""

    hardware_port: dict[str, str] = field(default_factory=dict)  # interface -> port component
    transceiver: dict[str, str] = field(default_factory=dict)    # interface -> transceiver component
    parent: dict[str, str] = field(default_factory=dict)         # component -> parent component
    kind: dict[str, str] = field(default_factory=dict)           # component -> type (PORT, TRANSCEIVER)
    interfaces: set[str] = field(default_factory=set)            # every interface name seen

    def learn(self, leaves: Iterable[Leaf]) -> None:
        for leaf in leaves:
            names = {e.name: e.key("name") for e in leaf.path if e.key("name") is not None}
            iface, comp = names.get("interface"), names.get("component")
            if iface and leaf.path and leaf.path[0].name == "interfaces":
                self.interfaces.add(iface)
            schema = leaf.schema
            val = _value(leaf.value)
            if val is None:
                continue
            if schema == "interfaces/interface/state/hardware-port" and iface:
                self.hardware_port[iface] = val
            elif schema == "interfaces/interface/state/transceiver" and iface:
                self.transceiver[iface] = val
            elif schema == "components/component/state/parent" and comp:
                self.parent[comp] = val
            elif schema == "components/component/state/type" and comp:
                self.kind[comp] = val.upper()
            elif schema == "components/component/subcomponents/subcomponent/state/name" and comp:
                self.parent.setdefault(val, comp)

    @property
    def known(self) -> bool:
        """Whether the device sent any tie at all (else only names can be used)."""
        return bool(self.hardware_port or self.transceiver or self.parent)

    def is_transceiver(self, component: str) -> bool:
        if self.kind.get(component) is not None:
            return self.kind[component] == "TRANSCEIVER"
        return component in self.transceiver.values() or bool(re.search(r"transceiver|xcvr", component, re.I))

    def port_of(self, component: str) -> tuple[str | None, str]:
        """(interface, how) for a component; interface None when nothing ties it."""
        for iface, comp in self.transceiver.items():
            if comp == component:
                return iface, "interface transceiver leaf"
        by_port = {}
        for iface, port in self.hardware_port.items():
            by_port.setdefault(port, iface)
        node, seen = component, set()
        while node is not None and node not in seen:  # the component, then its ancestors
            seen.add(node)
            if node in by_port:
                how = "hardware-port" if node == component else "parent hardware-port"
                return by_port[node], how
            node = self.parent.get(node)
        guess = _name_port(component)
        if guess is None:
            if component in self.interfaces:
                return component, "interface name"
            return None, "no tie"
        # a name like Ethernet-1/31-transceiver for interface ethernet-1/31: use the device's spelling
        for iface in self.interfaces:
            if iface.lower() == guess.lower():
                return iface, "name"
        return guess, "name"
