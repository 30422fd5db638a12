r"""The SNMP collector: IF-MIB counters and state, DOM optics and LLDP neighbours.

One mapping serves live polls and recorded walks: `samples_from_varbinds` takes
(oid, type, value) triples from a live poll (`collect_snmp`) or an snmpsim `.snmprec`
file (`parse_snmprec`). The transport is collectors/snmp_v2c.py for v2c (requests encoded
and responses decoded by snmp_ber, no pysnmp) and pysnmp's asyncio v3arch API for v3, with
numeric OIDs and no MIB lookups; each table group is read with multi-column GETBULK.

Port rule: port-level metrics are emitted only for physical Ethernet/InfiniBand
interfaces (ifType ethernetCsmacd, fastEther, fastEtherFX, gigabitEthernet, infiniband).
LAGs (Port-Channel, ae0), VLAN interfaces, loopbacks, tunnels and Junos logical units are
skipped by their ifType: their counters duplicate or aggregate the member ports'. Of the
physical ones, these rules leave out (first that applies):
  1. the endpoint's `management_ports` (inventory): declared, so not warned about;
  2. with `port_pattern` (a regex on the name), every name it does not match;
  3. up with ifConnectorPresent false(2), where the agent marks some interface true: internal
     and management interfaces (NX-OS mgmt0, Junos bme0/re0:mgmt-0). A down port without a
     connector stays a port: NX-OS, Junos and EOS say false for an empty cage. Not on OSes
     whose agent says false for up front ports (Dell OS9, `snmp_dialects.py`);
  4. ifAlias naming a management role ("Management0" is SONiC's alias of eth0);
  5. the management port names the OS reserves (collectors/snmp_dialects.py, exact names);
  6. on OSes whose bonds and bridges report ethernetCsmacd (Cumulus), non-front-panel names.
An up interface left out by rules 2-6 is named in the result's warnings: a rule must never
hide a fabric port silently (the old name prefix `eth\d` dropped all of Dell SONiC's `Eth1/N`).

Blind spots: for each poll group asked for, what the agent did not give is said in a warning
that starts with the group ("counters: ...", "optics: ...", "state: ...", "ports: ...").

Packets: port_rx/tx_packets_total is the sum of the HC unicast, multicast and
broadcast counters that the agent returns (IF-MIB splits them; the catalogue
counts all packets).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
import time
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol, TypeVar

from collectors import snmp_oids as O
from collectors.base import CollectResult, Neighbor, ParseError, Target, register
from collectors.snmp_dialects import GENERIC, Dialect, detect
from collectors.snmp_dom import optic_samples
from collectors.snmp_oids import COUNTER_BITS, Cells, Oid, Value, Varbind, dotted, text_of
from collectors.snmp_v2c import BerError, V2cSession, V2cTimeout, V2cUnreachable
from service.telemetry.samples import Sample
from service.telemetry.targets import GROUPS, group_of  # the poll groups tasks.py filters samples by

DEFAULT_MAX_REPETITIONS = 25
# Upper bound on varbinds asked for in one GETBULK (columns x repetitions): keeps a
# response well under a 64 KiB UDP datagram and under common agent limits.
DEFAULT_MAX_VARBINDS = 250
# Columns per GETBULK. Agents cap a response (snmpsim at 64 varbinds, many switches at one
# MTU), so a wide request mostly buys more request-encoding work (~40 µs a column in
# pysnmp) for the same number of values back; a narrow one gets more rows per column.
DEFAULT_MAX_COLUMNS = 10
DEFAULT_DEADLINE_S = 60.0
_MAX_ROWS_PER_COLUMN = 100_000  # guards against an agent that never ends a walk

# ---------------------------------------------------------------------------
# .snmprec parsing (snmpsim recordings)

_SNMPREC_TYPES = {2: "Integer", 4: "OctetString", 5: "Null", 6: "ObjectIdentifier", 64: "IpAddress",
                  65: "Counter32", 66: "Gauge32", 67: "TimeTicks", 68: "Opaque", 70: "Counter64",
                  128: "NoSuchObject", 129: "NoSuchInstance", 130: "EndOfMibView"}
_RANGES = {"Integer": (-(2**31), 2**31 - 1), "Counter32": (0, 2**32 - 1), "Gauge32": (0, 2**32 - 1),
           "TimeTicks": (0, 2**32 - 1), "Counter64": (0, 2**64 - 1)}
_OID_RE = re.compile(r"^\.?\d+(\.\d+)+$")
_TAG_RE = re.compile(r"^(\d+)([xe]?)$")


def parse_snmprec_varbinds(text: str, *, source: str = "<snmprec>") -> list[Varbind]:
    """`oid|tag|value` lines -> varbinds. Blank lines and '#' comments are skipped.

    Raises ParseError(source, reason, line) on the first malformed line.
    """
    out: list[Varbind] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            raise ParseError(source, f"expected 'oid|type|value', got {line[:60]!r}", n)
        oid_s, tag_s, raw = parts
        if not _OID_RE.match(oid_s):
            raise ParseError(source, f"not a numeric OID: {oid_s[:60]!r}", n)
        m = _TAG_RE.match(tag_s)
        if not m or int(m.group(1)) not in _SNMPREC_TYPES:
            raise ParseError(source, f"unknown or unsupported type tag {tag_s!r}", n)
        typ = _SNMPREC_TYPES[int(m.group(1))]
        out.append((O.oid(oid_s), typ, _snmprec_value(typ, m.group(2), raw, source, n)))
    return out


def _snmprec_value(typ: str, mod: str, raw: str, source: str, n: int) -> Value:
    if mod == "x":
        try:
            data = bytes.fromhex(raw)
        except ValueError:
            raise ParseError(source, f"bad hex value for {typ}: {raw[:40]!r}", n) from None
        if typ in _RANGES:
            return int.from_bytes(data, "big") if data else 0
        return data
    if mod == "e":  # snmpsim's escaped form: Python string escapes
        raw = raw.encode("latin-1", "backslashreplace").decode("unicode_escape")
    if typ in _RANGES:
        try:
            value = int(raw)
        except ValueError:
            raise ParseError(source, f"{typ} value is not an integer: {raw[:40]!r}", n) from None
        lo, hi = _RANGES[typ]
        if not lo <= value <= hi:
            raise ParseError(source, f"{typ} value {value} out of range [{lo}, {hi}]", n)
        return value
    if typ in ("OctetString", "Opaque"):
        return raw.encode("utf-8", "surrogateescape")
    if typ == "ObjectIdentifier":
        if raw and not _OID_RE.match(raw) and raw not in ("0.0",):
            raise ParseError(source, f"bad OID value: {raw[:40]!r}", n)
        return raw
    if typ == "IpAddress":
        if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", raw):
            raise ParseError(source, f"bad IpAddress value: {raw[:40]!r}", n)
        return raw
    return None


def parse_snmprec(text: str, *, device: str, ts_ms: int,
                  source: str = "<snmprec>") -> tuple[list[Sample], list[Neighbor]]:
    """A recorded walk -> (canonical samples, LLDP neighbours). ParseError on malformed lines."""
    mapped = samples_from_varbinds(parse_snmprec_varbinds(text, source=source), device=device, ts_ms=ts_ms)
    return mapped.samples, mapped.neighbors


# ---------------------------------------------------------------------------
# Mapping: varbinds -> canonical samples and neighbours


class Mapped(NamedTuple):
    samples: list[Sample]
    neighbors: list[Neighbor]
    warnings: list[str]


# ethernetCsmacd(6), fastEther(62), fastEtherFX(69), gigabitEthernet(117), infiniband(199)
_PHYSICAL_IF_TYPES = frozenset({6, 62, 69, 117, 199})
_TRUE, _FALSE = 1, 2  # TruthValue
_OPER_UP = 1
# ifAlias naming a management role: "Management0" (SONiC's alias of eth0), "mgmt", "OOB".
_MGMT_ALIAS_RE = re.compile(r"(?:management|mgmt|oob)[\s_/-]*\d*(?:/\d+)*", re.I)


@dataclass
class _Interfaces:
    label: dict[int, str] = field(default_factory=dict)  # every ifIndex -> ifName or ifDescr
    ports: dict[int, str] = field(default_factory=dict)  # real ports only
    names: dict[str, str] = field(default_factory=dict)  # ifName and ifDescr -> label
    left_out: list[tuple[str, str]] = field(default_factory=list)  # up physical interfaces a rule left out
    ambiguous: dict[str, list[int]] = field(default_factory=dict)  # a name several ports carry -> their ifIndex


@dataclass(frozen=True)
class PortRule:
    """What decides which physical interfaces are fabric ports (see the module docstring)."""

    dialect: Dialect = GENERIC
    pattern: re.Pattern[str] | None = None
    management_ports: frozenset[str] = frozenset()
    connectors: bool = False  # the agent marks interfaces with ifConnectorPresent

    def exclusion(self, name: str, alias: str, connector: int | None, up: bool) -> str | None:
        """Why `name` is not a fabric port ("" when the inventory says so), or None if it is one."""
        if name in self.management_ports:
            return ""
        if self.pattern is not None:
            return None if self.pattern.search(name) else f"does not match port_pattern {self.pattern.pattern!r}"
        if self.connectors and connector == _FALSE and up:
            return "up without a connector (ifConnectorPresent false)"
        if _MGMT_ALIAS_RE.fullmatch(alias.strip()):
            return f"management (ifAlias {alias!r})"
        if name in self.dialect.management:
            return f"management port name on {self.dialect.name}"
        front = self.dialect.front_ports
        if front is not None and not front.fullmatch(name):
            return f"not a {self.dialect.name} front-panel port name"
        return None


def dialect_of(cells: Cells) -> Dialect:
    """The agent's dialect, from the sysObjectID and sysDescr the poll read."""
    oid_text = next(iter(cells.texts(O.SYS_OBJECT_ID).values()), "")
    descr = next((v for _, v in cells.raw(O.SYS_DESCR).values()), b"")
    # sysDescr is free text: SONiC's spans lines, which text_of would show as hex.
    return detect(oid_text, descr.decode("utf-8", "replace") if isinstance(descr, bytes) else str(descr or ""))


def _interfaces(cells: Cells, rule: PortRule) -> _Interfaces:
    names = cells.texts((*O.IFX_ENTRY, O.IFX_NAME))
    descrs = cells.texts((*O.IF_ENTRY, O.IF_DESCR))
    types = cells.ints((*O.IF_ENTRY, O.IF_TYPE))
    aliases = cells.texts((*O.IFX_ENTRY, O.IFX_ALIAS))
    connectors = cells.ints((*O.IFX_ENTRY, O.IFX_CONNECTOR_PRESENT))
    oper = cells.ints((*O.IF_ENTRY, O.IF_OPER))
    # Rule 3 only where the agent tells interfaces apart: one that says false for all says nothing.
    rule = replace(rule, connectors=rule.dialect.connectors and any(
        v == _TRUE for i, v in connectors.items() if types.get(i) in _PHYSICAL_IF_TYPES))
    out = _Interfaces()
    for idx in sorted(names.keys() | descrs.keys() | types.keys()):
        if len(idx) != 1:
            continue
        label = names.get(idx) or descrs.get(idx)
        if not label:
            continue
        out.label[idx[0]] = label
        for alias in (names.get(idx), descrs.get(idx)):
            if alias:
                out.names.setdefault(alias, label)
        if idx in types and types[idx] not in _PHYSICAL_IF_TYPES:
            continue
        up = oper.get(idx) == _OPER_UP
        why = rule.exclusion(label, aliases.get(idx, ""), connectors.get(idx), up)
        if why is None:
            out.ports[idx[0]] = label
        elif why and up:
            out.left_out.append((label, why))
    # Two ports with one name (a stacked Dell OS9 S4048-ON has two "TenGigabitEthernet 1/33")
    # would mix their counters in one series: neither is collected, and the warning says so.
    by_name: dict[str, list[int]] = {}
    for i, label in out.ports.items():
        by_name.setdefault(label, []).append(i)
    for label, idxs in by_name.items():
        if len(idxs) > 1:
            out.ambiguous[label] = idxs
            for i in idxs:
                del out.ports[i]
    return out


def _port_samples(cells: Cells, ifs: _Interfaces, device: str, ts_ms: int,
                  read_ms: Mapping[Oid, int]) -> list[Sample]:
    out: list[Sample] = []

    def col(entry: Oid, c: int) -> tuple[dict[Oid, tuple[str, int]], int]:
        return cells.typed_ints((*entry, c)), read_ms.get((*entry, c), ts_ms)

    def counter(metric: str, column: tuple[dict[Oid, tuple[str, int]], int]) -> None:
        cells_, at = column
        for idx, (typ, v) in cells_.items():
            port = ifs.ports.get(idx[0]) if len(idx) == 1 else None
            if port:
                out.append(Sample(metric, float(v), at, device, port=port, counter_bits=COUNTER_BITS.get(typ)))

    def gauge(metric: str, column: tuple[dict[Oid, tuple[str, int]], int], conv: Any) -> None:
        cells_, at = column
        for idx, (_, v) in cells_.items():
            port = ifs.ports.get(idx[0]) if len(idx) == 1 else None
            if port:
                out.append(Sample(metric, float(conv(v)), at, device, port=port))

    gauge("port_oper_up", col(O.IF_ENTRY, O.IF_OPER), lambda v: v == 1)
    gauge("port_admin_up", col(O.IF_ENTRY, O.IF_ADMIN), lambda v: v == 1)
    gauge("port_last_change_seconds", col(O.IF_ENTRY, O.IF_LAST_CHANGE), lambda v: v / 100.0)
    gauge("port_speed_bits_per_second", col(O.IFX_ENTRY, O.IFX_HIGH_SPEED), lambda v: v * 1_000_000)
    counter("port_rx_bytes_total", col(O.IFX_ENTRY, O.IFX_HC_IN_OCTETS))
    counter("port_tx_bytes_total", col(O.IFX_ENTRY, O.IFX_HC_OUT_OCTETS))
    counter("port_rx_errors_total", col(O.IF_ENTRY, O.IF_IN_ERRORS))
    counter("port_tx_errors_total", col(O.IF_ENTRY, O.IF_OUT_ERRORS))
    counter("port_rx_discards_total", col(O.IF_ENTRY, O.IF_IN_DISCARDS))
    counter("port_tx_discards_total", col(O.IF_ENTRY, O.IF_OUT_DISCARDS))
    counter("port_rx_fcs_errors_total", col(O.DOT3_ENTRY, O.DOT3_FCS_ERRORS))
    for metric, parts in (("port_rx_packets_total", (O.IFX_HC_IN_UCAST, O.IFX_HC_IN_MCAST, O.IFX_HC_IN_BCAST)),
                          ("port_tx_packets_total", (O.IFX_HC_OUT_UCAST, O.IFX_HC_OUT_MCAST, O.IFX_HC_OUT_BCAST))):
        (ucast, at), *others = [col(O.IFX_ENTRY, c) for c in parts]
        summed: dict[Oid, tuple[str, int]] = {}
        for idx, (typ, v) in ucast.items():
            bits = COUNTER_BITS.get(typ, 64)
            for other, _ in others:
                if idx in other:
                    bits = min(bits, COUNTER_BITS.get(other[idx][0], 64))
                    v += other[idx][1]
            summed[idx] = ("Counter64" if bits == 64 else "Counter32", v)
        counter(metric, (summed, at))
    return out


# LldpPortIdSubtype: interfaceAlias(1) portComponent(2) macAddress(3) networkAddress(4)
# interfaceName(5) agentCircuitId(6) local(7)
_PORT_ID_IFNAME, _PORT_ID_MAC = 5, 3


def _neighbors(cells: Cells, ifs: _Interfaces) -> list[Neighbor]:
    loc_id = cells.texts((*O.LLDP_LOC_PORT_ENTRY, O.LLDP_LOC_PORT_ID))
    loc_desc = cells.texts((*O.LLDP_LOC_PORT_ENTRY, O.LLDP_LOC_PORT_DESC))
    rem = O.LLDP_REM_ENTRY
    sys_name = cells.texts((*rem, O.LLDP_REM_SYS_NAME))
    chassis = cells.raw((*rem, O.LLDP_REM_CHASSIS_ID))
    port_id = cells.raw((*rem, O.LLDP_REM_PORT_ID))
    port_desc = cells.texts((*rem, O.LLDP_REM_PORT_DESC))
    subtype = cells.ints((*rem, O.LLDP_REM_PORT_ID_SUBTYPE))
    out: list[Neighbor] = []
    for idx in sorted(sys_name.keys() | port_id.keys()):
        if len(idx) != 3:
            continue
        local_num = idx[1]
        local = (loc_id.get((local_num,)) or loc_desc.get((local_num,)) or ifs.label.get(local_num)
                 or str(local_num))
        raw_pid = port_id.get(idx, ("", b""))[1]
        if subtype.get(idx) == _PORT_ID_IFNAME:
            remote_port = text_of(raw_pid)
        elif subtype.get(idx) == _PORT_ID_MAC and isinstance(raw_pid, bytes) and len(raw_pid) == 6:
            remote_port = port_desc.get(idx) or raw_pid.hex(":")
        else:
            remote_port = port_desc.get(idx) or text_of(raw_pid)
        remote = sys_name.get(idx) or _chassis_text(chassis.get(idx, ("", None))[1])
        if remote and remote_port:
            out.append(Neighbor(local_port=local, remote_device=remote, remote_port=remote_port))
    return out


def _chassis_text(value: Value) -> str:
    if isinstance(value, bytes) and len(value) == 6:
        return value.hex(":")
    return text_of(value)


def samples_from_varbinds(varbinds: list[Varbind], *, device: str, ts_ms: int, port_pattern: str | None = None,
                          management_ports: Sequence[str] = (), groups: Sequence[str] | None = None,
                          read_ms: Mapping[Oid, int] | None = None) -> Mapped:
    """(oid, type, value) triples -> canonical samples, LLDP neighbours and warnings.

    Pure: the same code maps a live poll and a recorded walk. Unknown OIDs are ignored.
    `groups` are the poll groups asked for (None: all); only their blind spots are reported.
    Interface samples take their column's time in `read_ms` (when the agent answered), others `ts_ms`.
    """
    cells = Cells(varbinds)
    dialect = dialect_of(cells)
    rule = PortRule(dialect, re.compile(port_pattern) if port_pattern else None, frozenset(management_ports))
    ifs = _interfaces(cells, rule)
    samples = _port_samples(cells, ifs, device, ts_ms, read_ms or {})
    want = set(GROUPS if groups is None else groups)
    if "optics" in want:
        samples += optic_samples(cells, device=device, ts_ms=ts_ms, ifindex_port=ifs.ports,
                                 port_names={n: p for n, p in ifs.names.items() if p in ifs.ports.values()},
                                 dialect=dialect)
    cells.warnings += _blind_spots(ifs, samples, want)
    return Mapped(samples, _neighbors(cells, ifs), cells.warnings)


# What every fabric port should get per poll group: (metric, the MIB object it comes from).
_PER_PORT: dict[str, tuple[tuple[str, str], ...]] = {
    "state": (("port_oper_up", "ifOperStatus"), ("port_admin_up", "ifAdminStatus"),
              ("port_speed_bits_per_second", "ifHighSpeed"), ("port_last_change_seconds", "ifLastChange")),
    "counters": (("port_rx_bytes_total", "ifHCInOctets"), ("port_tx_bytes_total", "ifHCOutOctets"),
                 ("port_rx_packets_total", "ifHCInUcastPkts"), ("port_tx_packets_total", "ifHCOutUcastPkts"),
                 ("port_rx_errors_total", "ifInErrors"), ("port_tx_errors_total", "ifOutErrors"),
                 ("port_rx_discards_total", "ifInDiscards"), ("port_tx_discards_total", "ifOutDiscards"),
                 ("port_rx_fcs_errors_total", "dot3StatsFCSErrors")),
}
_SHOWN = 8  # names listed in one warning


def _listed(items: Sequence[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else "")


def _blind_spots(ifs: _Interfaces, samples: list[Sample], groups: set[str]) -> list[str]:
    """One warning per poll group for what the agent did not give: never a silent gap."""
    out: list[str] = []
    if ifs.left_out:
        out.append(f"ports: {len(ifs.left_out)} up interface(s) not collected as fabric ports: "
                   + _listed([f"{name} [{why}]" for name, why in ifs.left_out]))
    if ifs.ambiguous:
        out.append(f"ports: {len(ifs.ambiguous)} name(s) carried by more than one interface, not collected "
                   "(their samples would mix): "
                   + _listed([f"{name} [ifIndex {', '.join(map(str, idxs))}]" for name, idxs in ifs.ambiguous.items()]))
    ports = set(ifs.ports.values())
    if not ports:
        out.append(f"ports: none of the {len(ifs.label)} interfaces is a fabric port; nothing per port is collected")
        return out
    have: dict[str, set[str]] = {}
    for s in samples:
        if s.port is not None:
            have.setdefault(s.metric, set()).add(s.port)
    for group, expected in _PER_PORT.items():
        if group not in groups:
            continue
        gaps = [f"{obj} ({len(ports - have.get(metric, set()))} of {len(ports)} ports)"
                for metric, obj in expected if ports - have.get(metric, set())]
        if gaps:
            out.append(f"{group}: the agent gave no {', '.join(gaps)}; those metrics are not collected")
    if "optics" in groups and not any(s.metric.startswith("optic_") for s in samples):
        out.append("optics: no transceiver reading in ENTITY-SENSOR-MIB, CISCO-ENTITY-SENSOR-MIB or "
                   "JUNIPER-DOM-MIB (the agent exposes none, or none was tied to a port); optics are not collected")
    return out


# ---------------------------------------------------------------------------
# Transport: multi-column GETBULK, v2c through snmp_v2c/snmp_ber, v3 through pysnmp asyncio


class SnmpFailure(Exception):
    """A poll step failed; the message is safe to show (no secrets)."""


_AUTH = {"md5": "usmHMACMD5AuthProtocol", "sha": "usmHMACSHAAuthProtocol",
         "sha224": "usmHMAC128SHA224AuthProtocol", "sha256": "usmHMAC192SHA256AuthProtocol",
         "sha384": "usmHMAC256SHA384AuthProtocol", "sha512": "usmHMAC384SHA512AuthProtocol"}
_PRIV = {"des": "usmDESPrivProtocol", "aes": "usmAesCfb128Protocol", "aes128": "usmAesCfb128Protocol",
         "aes192": "usmAesCfb192Protocol", "aes256": "usmAesCfb256Protocol"}

# pysnmp error indications (class names in pysnmp.proto.errind) -> what an operator should know.
_ERRIND_HINTS = {
    "RequestTimedOut": "no response (timeout)",
    "WrongDigest": "SNMPv3 authentication failed: agent reported usmStatsWrongDigests "
                   "(wrong auth key or auth protocol)",
    "AuthenticationFailure": "SNMPv3 authentication failed (wrong auth key or auth protocol)",
    "DecryptionError": "SNMPv3 decryption failed: usmStatsDecryptionErrors (wrong privacy key or protocol)",
    "UnknownUserName": "SNMPv3 user unknown to the agent: usmStatsUnknownUserNames",
    "UnsupportedSecLevel": "SNMPv3 security level not supported for this user: usmStatsUnsupportedSecLevels",
    "NotInTimeWindow": "SNMPv3 message outside the agent's time window: usmStatsNotInTimeWindows",
    "UnknownEngineID": "SNMPv3 engine ID discovery failed: usmStatsUnknownEngineIDs",
}


def _version(target: Target) -> str:
    v = str(target.params.get("version", "2c")).lower().lstrip("v")
    if v in ("2", "2c"):
        return "2c"
    if v == "3":
        return "3"
    raise SnmpFailure(f"unsupported SNMP version {target.params.get('version')!r} (use '2c' or '3')")


def _auth_data(hl: Any, target: Target) -> Any:
    """v3 USM user data (v2c never reaches pysnmp's engine)."""
    user = target.params.get("user")
    if not user:
        raise SnmpFailure("v3 needs params['user']")
    auth_name = str(target.params.get("auth_protocol", "sha256")).lower()
    priv_name = str(target.params.get("priv_protocol", "aes")).lower()
    if auth_name not in _AUTH:
        raise SnmpFailure(f"unknown v3 auth_protocol {auth_name!r}; known: {sorted(_AUTH)}")
    if priv_name not in _PRIV:
        raise SnmpFailure(f"unknown v3 priv_protocol {priv_name!r}; known: {sorted(_PRIV)}")
    auth_key, priv_key = target.secrets.get("auth_key"), target.secrets.get("priv_key")
    for what, key in (("auth_key", auth_key), ("priv_key", priv_key)):
        if not key:
            raise SnmpFailure(f"v3 authPriv needs secrets['{what}']; none was resolved")
        if len(key) < 8:
            raise SnmpFailure(f"v3 secrets['{what}'] is shorter than 8 characters (RFC 3414 minimum)")
    return hl.UsmUserData(user, authKey=auth_key, privKey=priv_key,
                          authProtocol=getattr(hl, _AUTH[auth_name]), privProtocol=getattr(hl, _PRIV[priv_name]))


def _from_pysnmp(name: Any, value: Any) -> Varbind:
    typ = type(value).__name__
    if typ in ("Integer32", "Integer"):
        return tuple(name), "Integer", int(value)
    if typ == "Unsigned32":
        typ = "Gauge32"
    if typ in O.INT_TYPES:
        return tuple(name), typ, int(value)
    if typ in ("OctetString", "Opaque", "Bits"):
        return tuple(name), "OctetString" if typ == "Bits" else typ, value.asOctets()
    if typ == "IpAddress":
        return tuple(name), typ, ".".join(str(b) for b in value.asOctets())
    if typ in ("ObjectIdentifier", "ObjectName", "ObjectIdentity"):
        return tuple(name), "ObjectIdentifier", ".".join(map(str, value))
    return tuple(name), typ, None


_END_OF_COLUMN = frozenset({"EndOfMibView", "NoSuchObject", "NoSuchInstance"})


class _Bulk(Protocol):
    """One GETBULK: (columns, max-repetitions) -> (error-status, error-index, varbinds)."""

    async def __call__(self, columns: Sequence[Oid], reps: int) -> tuple[int, int, list[Varbind]]: ...


async def walk_columns(bulk: _Bulk, columns: Sequence[Oid], *, max_repetitions: int,
                       max_varbinds: int, read_ms: dict[Oid, int] | None = None) -> list[Varbind]:
    """Walk table columns side by side with GETBULK until each leaves its subtree.

    `read_ms` gets, per column, the wall time its first response arrived: when the agent read it."""
    out: list[Varbind] = []
    last: dict[Oid, Oid] = {c: c for c in columns}
    rows = 0
    while last:
        cols = list(last)
        width = len(cols)
        reps = max(1, min(max_repetitions, max_varbinds // width))
        err_stat, err_idx, vbs = await bulk([last[c] for c in cols], reps)
        if read_ms is not None:
            arrived = int(time.time() * 1000)
            for c in cols:
                read_ms.setdefault(c, arrived)
        where = dotted(cols[0]) if width == 1 else f"{dotted(cols[0])} (+{width - 1} columns)"
        if err_stat:
            bad = dotted(cols[err_idx - 1]) if 0 < err_idx <= width else where
            raise SnmpFailure(f"GETBULK {bad}: agent answered error-status {_ERROR_STATUS.get(err_stat, err_stat)}")
        if not vbs:
            raise SnmpFailure(f"GETBULK {where}: empty response")
        lens = [len(c) for c in cols]
        for i, vb in enumerate(vbs):
            k = i % width
            col = cols[k]
            prev = last.get(col)
            if prev is None:
                continue
            o = vb[0]
            if vb[1] in _END_OF_COLUMN or o[: lens[k]] != col:
                del last[col]
            elif o <= prev:
                raise SnmpFailure(f"GETBULK {dotted(col)}: agent returned OID {dotted(o)} "
                                  f"not after {dotted(prev)} (broken walk order)")
            else:
                last[col] = o
                out.append(vb)
        rows += reps
        if rows > _MAX_ROWS_PER_COLUMN:
            raise SnmpFailure(f"GETBULK {where}: more than {_MAX_ROWS_PER_COLUMN} rows; walk abandoned")
    return out


# RFC 3416 error-status names, for messages
_ERROR_STATUS = dict(enumerate(
    ("noError", "tooBig", "noSuchName", "badValue", "readOnly", "genErr", "noAccess", "wrongType", "wrongLength",
     "wrongEncoding", "wrongValue", "noCreation", "inconsistentValue", "resourceUnavailable", "commitFailed",
     "undoFailed", "authorizationError", "notWritable", "inconsistentName")))


def _timeout_hint(target: Target) -> str:
    hint = f"{_ERRIND_HINTS['RequestTimedOut']} within {target.timeout_s:g}s x {target.retries + 1} tries"
    if _version(target) == "3":
        # net-snmp drops what it cannot decrypt instead of sending a report
        hint += "; with SNMPv3 a wrong privacy key looks the same (agents drop undecryptable requests)"
    return hint


def _describe(err_ind: Any, target: Target) -> str:
    if type(err_ind).__name__ == "RequestTimedOut":
        return _timeout_hint(target)
    return _ERRIND_HINTS.get(type(err_ind).__name__, str(err_ind))


class _NoMibCompiler:
    """Stands in for pysmi: pysnmp would otherwise attach a compiler that fetches MIBs
    from the network on a lookup miss. We use numeric OIDs only, so any miss is a bug."""

    def compile(self, *names: str, **_: Any) -> dict[str, str]:
        return {n: "missing" for n in names}


def _engine(hl: Any) -> Any:
    from pysnmp.smi import mibs, view

    engine = hl.SnmpEngine()
    builder = engine.get_mib_builder()
    builder.set_mib_compiler(_NoMibCompiler(), mibs.__path__[0])
    # hlapi keeps its MIB view in engine.cache; seed it with the compiler-less builder
    engine.cache["mibViewController"] = view.MibViewController(builder)
    return engine


# v3 engines per event loop, one per credential set: building one costs ~60 ms of CPU, and a
# reused engine also keeps the agents' engine IDs and clocks (no discovery round trip per poll).
# Keyed by a digest of the credentials so two key sets for one user name never share USM state.
_ENGINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


def _v3_engine(hl: Any, target: Target) -> Any:
    p, s = target.params, target.secrets
    ident = "\0".join(str(x) for x in (p.get("user"), p.get("auth_protocol"), p.get("priv_protocol"),
                                       s.get("auth_key"), s.get("priv_key")))
    key = hashlib.sha256(ident.encode()).hexdigest()
    engines = _ENGINES.setdefault(asyncio.get_running_loop(), {})
    if key not in engines:
        engines[key] = _engine(hl)
    return engines[key]


def _community(target: Target) -> str:
    community = target.secrets.get("community")
    if not community:
        raise SnmpFailure("v2c needs secrets['community']; none was resolved")
    return community


async def _walk_v2c(target: Target, columns: list[list[Oid]], reps: int, max_vbs: int,
                    read_ms: dict[Oid, int]) -> list[Varbind]:
    """v2c: requests encoded and responses decoded by snmp_ber (through snmp_v2c), no pysnmp."""
    session = V2cSession(target.address, target.port or 161, _community(target),
                         timeout_s=target.timeout_s, retries=target.retries)

    async def bulk(cols: Sequence[Oid], n: int) -> tuple[int, int, list[Varbind]]:
        where = dotted(cols[0]) if len(cols) == 1 else f"{dotted(cols[0])} (+{len(cols) - 1} columns)"
        try:
            resp = await session.getbulk(cols, n)
        except V2cTimeout:
            raise SnmpFailure(f"GETBULK {where}: {_timeout_hint(target)}") from None
        except V2cUnreachable as exc:
            raise SnmpFailure(f"GETBULK {where}: no response ({exc})") from None
        except BerError as exc:
            raise SnmpFailure(f"GETBULK {where}: malformed response: {exc.reason}") from None
        return resp.error_status, resp.error_index, resp.varbinds

    out: list[Varbind] = []
    try:
        async with session:
            for cols in columns:
                out += await walk_columns(bulk, cols, max_repetitions=reps, max_varbinds=max_vbs, read_ms=read_ms)
    except OSError as exc:  # address resolution or socket setup
        raise SnmpFailure(f"cannot reach {target.address}:{target.port or 161}: {exc}") from None
    return out


async def _walk_v3(target: Target, columns: list[list[Oid]], reps: int, max_vbs: int,
                   read_ms: dict[Oid, int]) -> list[Varbind]:
    """v3 authPriv: entirely pysnmp (USM, engine discovery, decryption, decoding)."""
    import pysnmp.hlapi.v3arch.asyncio as hl  # heavy import, only when polling v3

    auth = _auth_data(hl, target)
    engine = _v3_engine(hl, target)
    transport = await hl.UdpTransportTarget.create(
        (target.address, target.port or 161), timeout=target.timeout_s, retries=target.retries)
    context = hl.ContextData()

    async def bulk(cols: Sequence[Oid], n: int) -> tuple[int, int, list[Varbind]]:
        req = [hl.ObjectType(hl.ObjectIdentity(dotted(c))) for c in cols]
        err_ind, err_stat, err_idx, vbs = await hl.bulk_cmd(
            engine, auth, transport, context, 0, n, *req, lookupMib=False)
        if err_ind:
            where = dotted(cols[0]) if len(cols) == 1 else f"{dotted(cols[0])} (+{len(cols) - 1} columns)"
            raise SnmpFailure(f"GETBULK {where}: {_describe(err_ind, target)}")
        return int(err_stat), int(err_idx), [_from_pysnmp(name, value) for name, value in vbs]

    out: list[Varbind] = []
    for cols in columns:
        out += await walk_columns(bulk, cols, max_repetitions=reps, max_varbinds=max_vbs, read_ms=read_ms)
    return out


def walk_plan(groups: Sequence[str], poll_groups: Sequence[str] | None) -> list[list[Oid]]:
    """The column sets to walk: the named walk groups, narrowed to the columns the due poll
    groups (counters, optics, state) need. No poll_groups: every column of every group."""
    if poll_groups is None:
        return [list(O.WALK_GROUPS[g]) for g in groups]

    due = set(poll_groups)
    # DOM tables also carry device temperatures, which group_of files under its own group.
    serves = {**O.COLUMN_POLL_GROUPS, **{c: frozenset({"optics", group_of("device_temperature_celsius")})
                                         for c in O.DEVICE_TEMP_COLUMNS}}
    plan = []
    for g in groups:
        # columns without a poll group (ifName, ifDescr, ifType) name the ports: always read
        cols = [c for c in O.WALK_GROUPS[g] if c not in serves or serves[c] & due]
        if cols:
            plan.append(cols)
    return plan


async def _poll(target: Target) -> Mapped:
    groups = target.params.get("groups") or list(O.DEFAULT_GROUPS)
    unknown = [g for g in groups if g not in O.WALK_GROUPS]
    if unknown:
        raise SnmpFailure(f"unknown walk group(s) {unknown}; known: {list(O.WALK_GROUPS)}")
    poll_groups = target.params.get("poll_groups")
    columns = walk_plan(groups, None if poll_groups is None else list(poll_groups))
    reps = int(target.params.get("max_repetitions") or DEFAULT_MAX_REPETITIONS)
    max_vbs = int(target.params.get("max_varbinds") or DEFAULT_MAX_VARBINDS)
    width = int(target.params.get("max_columns") or DEFAULT_MAX_COLUMNS)
    columns = [cols[i:i + width] for cols in columns for i in range(0, len(cols), width)]
    # Samples are stamped when the agent answered, not when the poll was queued: a poll that waited
    # seconds for a worker or a socket would otherwise turn the same counter delta into a wrong rate.
    read_ms: dict[Oid, int] = {}
    if _version(target) == "2c":
        varbinds = await _walk_v2c(target, columns, reps, max_vbs, read_ms)
    else:
        varbinds = await _walk_v3(target, columns, reps, max_vbs, read_ms)
    first_answer = min(read_ms.values(), default=int(time.time() * 1000))
    return samples_from_varbinds(varbinds, device=target.device, ts_ms=first_answer, read_ms=read_ms,
                                 port_pattern=target.params.get("port_pattern"),
                                 management_ports=target.params.get("management_ports") or (),
                                 groups=None if poll_groups is None else list(poll_groups))


async def collect_snmp_async(target: Target, *, now_ms: int) -> CollectResult:
    """Poll one target. Every failure becomes CollectResult.error; nothing is raised.

    `now_ms` (when the poll was due) does not stamp the samples: they carry when the agent answered."""
    t0 = time.monotonic()
    res = CollectResult(target=target.name)
    where = f"snmp target {target.name} ({target.address}:{target.port or 161})"
    deadline = float(target.params.get("deadline_s") or DEFAULT_DEADLINE_S)
    try:
        mapped = await asyncio.wait_for(_poll(target), timeout=deadline)
        res.samples, res.neighbors, res.warnings = mapped.samples, mapped.neighbors, mapped.warnings
        if not mapped.samples:
            res.warnings.append(f"{where}: the agent answered but no canonical metric was found")
    except SnmpFailure as exc:
        res.error = f"{where}: {exc}"
    except TimeoutError:
        res.error = f"{where}: poll did not finish within its {deadline:g}s deadline"
    except Exception as exc:  # never let one target's surprise escape the collector
        res.error = f"{where}: unexpected {type(exc).__name__}: {_scrub(str(exc), target)}"
    res.duration_s = time.monotonic() - t0
    return res


def _scrub(msg: str, target: Target) -> str:
    for secret in target.secrets.values():
        if secret:
            msg = msg.replace(secret, "***")
    return msg[:300]


async def collect_many_async(targets: Sequence[Target], *, now_ms: int, concurrency: int = 64) -> list[CollectResult]:
    """Poll targets concurrently; a bad target only spoils its own result."""
    gate = asyncio.Semaphore(concurrency)

    async def one(t: Target) -> CollectResult:
        async with gate:
            return await collect_snmp_async(t, now_ms=now_ms)

    return list(await asyncio.gather(*(one(t) for t in targets)))


T = TypeVar("T")


class _LoopThread:
    """A long-lived event loop on a daemon thread: v3 engines cached on it outlive one poll."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="fabricwatch-snmp", daemon=True).start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_worker: _LoopThread | None = None
_worker_lock = threading.Lock()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from sync code on this process's SNMP loop (also when the caller runs one).

    Made lazily and per process id: a forked worker child (Celery prefork) starts its own.
    """
    global _worker
    with _worker_lock:
        if _worker is None or _worker.pid != os.getpid():
            _worker = _LoopThread()
        worker = _worker
    return worker.run(coro)


@register("snmp")
def collect_snmp(target: Target, *, now_ms: int) -> CollectResult:
    """Poll one SNMP target (v2c or v3 authPriv): IF-MIB, DOM optics and LLDP neighbours."""
    return _run(collect_snmp_async(target, now_ms=now_ms))


def collect_many(targets: Sequence[Target], *, now_ms: int, concurrency: int = 64) -> list[CollectResult]:
    """Sync wrapper of collect_many_async."""
    return _run(collect_many_async(targets, now_ms=now_ms, concurrency=concurrency))
