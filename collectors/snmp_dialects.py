"""SNMP dialects: what differs between network operating systems, as one table row each.

A poll picks its dialect from sysObjectID and sysDescr (`detect`). A dialect says:

* `management`: the interface names the OS reserves for its management port. Exact names, never
  patterns: the prefix rule `eth\\d` this replaced also matched every `Eth1/N` front port of Dell
  Enterprise SONiC and NVIDIA Onyx, and the switch reported itself healthy with no port at all.
* `front_ports`: on Linux-based OSes whose bonds, bridges and VLAN devices all report ifType
  ethernetCsmacd (Cumulus), the form of a front-panel port name.
* `connectors`: False where the agent's ifConnectorPresent cannot be trusted (Dell Networking
  OS9 9.9 on an S4048-ON says false for every front port, up or down, and true for its
  management ports), so the "up without a connector" rule is not applied there.
* `entity_layouts`: how the agent numbers ENTITY-MIB transceiver entities, which ties a sensor
  to its ifIndex and lane without reading its name (SONiC names sensors after its internal port
  names, "DOM RX Power Sensor for Ethernet52/1", which need not be the ifName, "Eth1/53").

Everything else (ifType, ifConnectorPresent, ifAlias, ENTITY-MIB containment and alias mapping,
lane words in sensor names) is read the same way on every platform; see collectors/snmp.py and
collectors/snmp_dom.py. docs/devices.md lists what each platform was tested with.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EntityLayout:
    """entPhysicalIndex = base + ifIndex * stride + offset, with 0 <= offset < stride."""

    name: str
    base: int
    stride: int
    lane_of: Callable[[int], int | None]  # offset -> 1-based lane; None: the module, not a lane

    def locate(self, index: int) -> tuple[int, int | None] | None:
        """(ifIndex, 1-based lane or None) that `index` encodes, or None if it encodes none."""
        if index < self.base + self.stride:
            return None
        ifindex, offset = divmod(index - self.base, self.stride)
        return ifindex, self.lane_of(offset)


# sonic-snmpagent since 2021 (physical_entity_sub_oid_generator.py): the transceiver is
# 1000000000 + ifIndex*100, its sensors add type*10 + lane (temperature 1, Tx power 2, Rx power 3,
# Tx bias 4, voltage 5; lane 1..8, 0 for the module). Dell Enterprise SONiC 4.4: "DOM RX Power
# Sensor for Ethernet52/2" is 1000005332, inside "QSFP28 for Ethernet52" 1000005300, ifIndex 53.
SONIC_ENTITY = EntityLayout("sonic", 1_000_000_000, 100, lambda off: off % 10 or None)
# sonic-snmpagent before that: the transceiver is ifIndex*1000, its sensors add 1 (temperature),
# 2 (voltage) or lane*10 + 1/2/3 (Rx power, Tx bias, Tx power).
SONIC_ENTITY_LEGACY = EntityLayout("sonic-legacy", 0, 1000, lambda off: off // 10 or None)


@dataclass(frozen=True)
class Dialect:
    name: str
    sys_object_ids: tuple[str, ...] = ()  # sysObjectID prefixes (dotted, no leading dot)
    sys_descr: re.Pattern[str] | None = None  # searched in sysDescr when no prefix matched
    management: frozenset[str] = frozenset()
    front_ports: re.Pattern[str] | None = None
    entity_layouts: tuple[EntityLayout, ...] = ()
    connectors: bool = True  # ifConnectorPresent tells internal interfaces from ports


# Dell Networking OS9 (FTOS) names its management ports "ManagementEthernet <unit>/<port>",
# one per stack unit (0-11) on an S4048-ON, "ManagementEthernet 1/1" on a Z9100-ON.
_OS9_MANAGEMENT = frozenset(f"ManagementEthernet {u}/{p}" for u in range(12) for p in range(2))


DIALECTS: tuple[Dialect, ...] = (
    # SONiC answers with net-snmp's Linux sysObjectID (community) or a vendor's (Dell/Broadcom
    # 4413), so its sysDescr ("SONiC Software Version: ...") decides. Order matters: first match wins.
    Dialect("sonic", sys_descr=re.compile(r"\bSONiC\b"), management=frozenset({"eth0"}),
            entity_layouts=(SONIC_ENTITY, SONIC_ENTITY_LEGACY)),
    Dialect("cumulus", ("1.3.6.1.4.1.40310",), re.compile(r"Cumulus", re.I), frozenset({"eth0"}),
            front_ports=re.compile(r"swp\d+(?:s\d+)?")),
    Dialect("arista-eos", ("1.3.6.1.4.1.30065",), re.compile(r"Arista Networks EOS"),
            frozenset({"Management0", "Management1", "Management2", "Management1/1", "Management1/2"})),
    Dialect("cisco-nxos", ("1.3.6.1.4.1.9.12.3",), re.compile(r"NX-OS"), frozenset({"mgmt0"})),
    Dialect("juniper-junos", ("1.3.6.1.4.1.2636",), re.compile(r"JUNOS"),
            frozenset({"fxp0", "fxp1", "em0", "em1", "me0", "vme", "re0:mgmt-0", "re1:mgmt-0"})),
    Dialect("dell-os10", ("1.3.6.1.4.1.674.11000.5000.100",), re.compile(r"\bOS10\b"), frozenset({"mgmt1/1/1"})),
    Dialect("nvidia-onyx", ("1.3.6.1.4.1.33049",), re.compile(r"\b(?:Onyx|MLNX-OS)\b"), frozenset({"mgmt0", "mgmt1"})),
    Dialect("nokia-srlinux", (), re.compile(r"\bSR ?Linux\b", re.I), frozenset({"mgmt0"})),
    # SR OS (TiMOS) on 7250 IXR / 7750: the CPM management ports are A/1 and B/1. SR Linux shares
    # Nokia's enterprise number, so it is recognised first, by its sysDescr.
    Dialect("nokia-sros", ("1.3.6.1.4.1.6527.1.3",), re.compile(r"\bTiMOS\b"),
            frozenset({"A/1", "A/2", "A/3", "A/4", "B/1", "B/2", "B/3", "B/4"})),
    Dialect("dell-os9", ("1.3.6.1.4.1.6027",), re.compile(r"Dell Networking OS|Force10"), _OS9_MANAGEMENT,
            connectors=False),
    # PicOS reports its VLAN interfaces and `loopback` as ethernetCsmacd: front ports are
    # ge-/te-/xe-/qe-<unit>/<slot>/<port> (1, 10, 25, 40 G).
    Dialect("picos", ("1.3.6.1.4.1.35098",), re.compile(r"PicOS"), frozenset({"eth0"}),
            front_ports=re.compile(r"(?:ge|te|xe|qe|hu)-\d+/\d+/\d+")),
)
# Unknown OS: any management name of any dialect (none of them names a front port anywhere).
GENERIC = Dialect("generic", management=frozenset().union(*(d.management for d in DIALECTS)))


def detect(sys_object_id: str, sys_descr: str) -> Dialect:
    """The first dialect whose sysObjectID prefix or sysDescr pattern fits; GENERIC when none does."""
    oid = sys_object_id.lstrip(".")
    for d in DIALECTS:
        if any(oid == p or oid.startswith(p + ".") for p in d.sys_object_ids):
            return d
        if d.sys_descr is not None and d.sys_descr.search(sys_descr):
            return d
    return GENERIC
