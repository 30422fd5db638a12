"""Optics (DOM) over SNMP: ENTITY-SENSOR-MIB, CISCO-ENTITY-SENSOR-MIB and JUNIPER-DOM-MIB.

Every reading ends as a canonical optic_* sample in base units: dBm for optical
power, amperes, celsius and volts. Rules, each taken from what the real walks in
tests/data/real/snmp contain:

* A sensor belongs to a port through ENTITY-MIB, in this order: its entPhysicalContainedIn
  chain reaches an entity with an entAliasMapping to an ifIndex (Cisco); its index, or an
  ancestor's, follows the OS's known index layout (SONiC: 1000000000 + ifIndex*100 + sensor,
  collectors/snmp_dialects.py); one of the sensor's or its ancestors' names or descriptions
  names a known interface ("DOM RX Power Sensor for Ethernet21" on Arista, "Ethernet1/25
  Lane 1 Transceiver ..." on Cisco). A transceiver sensor tied to no port is named in a warning.
* A sensor is an optic sensor when its chain mentions a transceiver (Xcvr, Transceiver,
  DOM, optic) or an index layout places it. Other celsius sensors become
  device_temperature_celsius with `port` naming the component.
* Lanes are 0-based. The lane comes from per-lane OIDs (Juniper's lane table, the SONiC
  index layout), else from the name: "Lane N", "Channel N", "Rx N"/"TxN", a trailing
  "Power N", or a suffix on the port or module name ("Ethernet52/2", "et-0/0/1-3", ":N").
  Arista numbers name lanes from 0, Cisco and SONiC from 1; the base of named lanes is taken
  per device from the lowest one it shows. A lone lane-less reading of a kind is lane 0; a
  lane-less reading beside others of its kind cannot be placed and is named in a warning.
* Watts become dBm; 0 W (no light) clamps at -40 dBm. A negative power (Arista's
  -1000000000 sentinel for "no reading") is dropped with a warning, not clamped:
  it is an absent reading, not a dark receiver.
* Sources that report dBm natively (Cisco type dBm, Juniper) send 0 dBm, 0 dBm and
  0 A for modules without optical monitoring (DACs, empty lanes). Such an all-zero
  lane is dropped with a warning: 1 mW of light with no bias current is not physics.
* Transceiver sensors whose status is not ok(1) give no reading; they are named in a warning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from collectors import snmp_oids as O
from collectors.snmp_dialects import GENERIC, Dialect
from collectors.snmp_oids import Cells, Oid
from service.telemetry.samples import Sample

DBM_FLOOR = -40.0

# EntitySensorDataScale / SensorDataScale (both MIBs use the same numbering; note
# exa(14) sits before peta(15) in the MIB).
_SCALE = {1: 1e-24, 2: 1e-21, 3: 1e-18, 4: 1e-15, 5: 1e-12, 6: 1e-9, 7: 1e-6, 8: 1e-3, 9: 1.0,
          10: 1e3, 11: 1e6, 12: 1e9, 13: 1e12, 14: 1e18, 15: 1e15, 16: 1e21, 17: 1e24}
# Sensor data types (shared numbering; dBm(14) exists only in the Cisco MIB).
_VOLTS_DC, _AMPERES, _WATTS, _CELSIUS, _DBM = 4, 5, 6, 8, 14
_STATUS_OK = 1

# Not "SFP": chassis descriptions say "24-port SFP+ 10GigE" and would claim every sensor.
_XCVR_RE = re.compile(r"xcvr|transceiver|\bdom\b|optic", re.I)
_RX_RE = re.compile(r"\brx(?=\d|\b)|receive", re.I)  # "RX Power", "Rx2 Power"
_TX_RE = re.compile(r"\btx(?=\d|\b)|transmit|output", re.I)
_TOKEN_STRIP = "()[]{},;\"'"
# Lane words, tried on the sensor's names, then its ancestors' (Arista: "Lane 0 for Xcvr for
# Ethernet1" holds the sensors of lane 0).
_LANE_WORDS = (
    re.compile(r"\blane\s*#?\s*(\d{1,2})\b", re.I),  # "Lane 1" (Cisco, Arista)
    re.compile(r"\b(?:channel|ch)\s*#?\s*(\d{1,2})\b", re.I),  # "Channel 2"
    re.compile(r"\b[rt]x\s?(\d{1,2})(?!\d)", re.I),  # "RX2 Power", "Tx3Bias"
    re.compile(r"\b(?:power|bias|current)\s+(\d{1,2})$", re.I),  # "... Rx Power 3"
)
# A lane as a suffix of the port's or module's own name: "Ethernet52/2", "et-0/0/1-3", "swp1:0".
_LANE_SUFFIX = r"(?:[/:._-]|\s+(?=\d+$))(\d{1,2})(?![\d/:.])"
_STATUS_NAMES = {2: "unavailable", 3: "nonoperational"}


def watts_to_dbm(watts: float) -> float:
    """Optical power in W -> dBm, clamped at -40 dBm (0 W, i.e. no light, lands there)."""
    mw = watts * 1000.0
    if mw <= 0:
        return DBM_FLOOR
    return max(DBM_FLOOR, 10.0 * math.log10(mw))


@dataclass
class _Lane:
    rx_dbm: float | None = None
    tx_dbm: float | None = None
    bias_a: float | None = None
    dbm_native: bool = False


@dataclass
class _Optics:
    """Readings gathered per port before they become samples (first source wins)."""

    lanes: dict[tuple[str, int], _Lane] = field(default_factory=dict)
    temperature: dict[str, float] = field(default_factory=dict)
    voltage: dict[str, float] = field(default_factory=dict)
    device_temps: dict[str, float] = field(default_factory=dict)

    def lane(self, port: str, lane: int) -> _Lane:
        return self.lanes.setdefault((port, lane), _Lane())


@dataclass(frozen=True)
class _Reading:
    """One transceiver lane reading found in a sensor table, before it is placed on a lane."""

    index: int  # entPhysicalIndex: the same sensor may appear in two MIBs
    name: str  # for warnings
    port: str
    lane: int | None  # as found; None: the sensor names no lane
    zero_based: bool  # lane from per-lane OIDs, already 0-based (else a name's, base inferred)
    kind: str  # rx, tx, bias
    value: float
    native_dbm: bool


class _EntityTree:
    """ENTITY-MIB names, containment and alias mapping, for finding a sensor's port and lane."""

    def __init__(self, cells: Cells, port_names: dict[str, str], ifindex_port: dict[int, str],
                 dialect: Dialect) -> None:
        self.port_names = port_names  # any interface name or descr -> port label
        self.ifindex_port = ifindex_port
        self.layouts = dialect.entity_layouts
        self.descr = cells.texts((*O.ENT_PHYS_ENTRY, O.ENT_DESCR))
        self.name = cells.texts((*O.ENT_PHYS_ENTRY, O.ENT_NAME))
        self.parent = cells.ints((*O.ENT_PHYS_ENTRY, O.ENT_CONTAINED_IN))
        self.alias: dict[Oid, str] = {}
        for idx, target in cells.texts(O.ENT_ALIAS_ID).items():
            # entAliasMappingIdentifier = ifIndex instance OID (…2.2.1.1.<ifIndex>)
            m = re.fullmatch(r"\.?1\.3\.6\.1\.2\.1\.2\.2\.1\.1\.(\d+)", target)
            if m and idx and int(m.group(1)) in ifindex_port:
                self.alias.setdefault(idx[:1], ifindex_port[int(m.group(1))])

    def chain(self, idx: Oid) -> list[Oid]:
        out: list[Oid] = []
        while idx and idx not in out and len(out) < 8:
            out.append(idx)
            parent = self.parent.get(idx)
            if not parent:
                break
            idx = (parent,)
        return out

    def texts(self, idx: Oid) -> list[str]:
        return [t for t in (self.descr.get(idx, ""), self.name.get(idx, "")) if t]

    def label(self, idx: Oid) -> str:
        return f"'{(self.texts(idx) or ['?'])[0]}' ({idx[0]})"

    def locate(self, chain: list[Oid]) -> tuple[str | None, int | None]:
        """(port, 0-based lane from the index layout) by alias mapping, then index layout."""
        for e in chain:
            if e in self.alias:
                return self.alias[e], None
        for layout in self.layouts:
            for e in chain:
                hit = layout.locate(e[0])
                if hit is not None and hit[0] in self.ifindex_port:
                    lane = hit[1] if e == chain[0] else None  # an ancestor's lane is not the sensor's
                    return self.ifindex_port[hit[0]], None if lane is None else lane - 1
        return None, None

    def named_port(self, chain: list[Oid]) -> tuple[str | None, str | None]:
        """(port, the name token that named it) from the chain's names and descriptions."""
        for e in chain:
            for text in self.texts(e):
                for tok in text.split():
                    tok = tok.strip(_TOKEN_STRIP)
                    if tok in self.port_names:
                        return self.port_names[tok], tok
        return None, None

    def named_lane(self, chain: list[Oid], anchors: list[str]) -> int | None:
        """A lane number written in the sensor's or its ancestors' names (see the module docstring)."""
        for e in chain:
            for text in self.texts(e):
                for form in _LANE_WORDS:
                    m = form.search(text)
                    if m:
                        return int(m.group(1))
        own = self.texts(chain[0])
        for anchor in anchors:
            for text in own:
                m = re.search(re.escape(anchor) + _LANE_SUFFIX, text)
                if m:
                    return int(m.group(1))
        return None

    def is_xcvr(self, chain: list[Oid]) -> bool:
        return any(_XCVR_RE.search(t) for e in chain for t in self.texts(e))


@dataclass
class _Found:
    """What the sensor tables hold, and what could not be used (for warnings)."""

    readings: list[_Reading] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # transceiver sensors tied to no port
    not_ok: list[str] = field(default_factory=list)
    negative: list[str] = field(default_factory=list)
    unknown_kind: list[str] = field(default_factory=list)


def _sensor_table(cells: Cells, tree: _EntityTree, entry: Oid, optics: _Optics, found: _Found) -> None:
    """Read one ENTITY-SENSOR-shaped table into lane readings and port-level readings."""
    types = cells.ints((*entry, O.SENSOR_TYPE))
    scales = cells.ints((*entry, O.SENSOR_SCALE))
    precs = cells.ints((*entry, O.SENSOR_PRECISION))
    values = cells.ints((*entry, O.SENSOR_VALUE))
    status = cells.ints((*entry, O.SENSOR_STATUS))
    for idx, stype in types.items():
        if stype not in (_VOLTS_DC, _AMPERES, _WATTS, _CELSIUS, _DBM) or idx not in values:
            continue
        chain = tree.chain(idx)
        port, lane = tree.locate(chain)
        xcvr = port is not None or tree.is_xcvr(chain)
        st = status.get(idx, _STATUS_OK)
        if st != _STATUS_OK:
            if xcvr:
                found.not_ok.append(f"{tree.label(idx)} {_STATUS_NAMES.get(st, f'status {st}')}")
            continue
        scale = _SCALE.get(scales.get(idx, 9))
        if scale is None:
            cells.warn(f"optics: sensor {tree.label(idx)}: unknown scale {scales.get(idx)}; skipped")
            continue
        value = values[idx] * scale * 10.0 ** (-precs.get(idx, 0))
        if stype == _CELSIUS and not xcvr:
            label = tree.name.get(idx) or tree.descr.get(idx) or f"sensor {idx[0]}"
            if label in optics.device_temps:  # names repeat ("Board temp sensor" twice on Arista)
                label = f"{label} {idx[0]}"
            optics.device_temps[label] = value
            continue
        if not xcvr:
            continue
        anchors = [a for e in chain[1:] for a in [tree.name.get(e, "")] if a]
        if port is None:
            port, token = tree.named_port(chain)
            anchors = [token] if token else []
        if port is None:
            found.unplaced.append(tree.label(idx))
            continue
        if stype == _CELSIUS:
            optics.temperature.setdefault(port, value)
            continue
        if stype == _VOLTS_DC:
            optics.voltage.setdefault(port, value)
            continue
        text = " ".join(tree.texts(idx))
        kind = "bias" if stype == _AMPERES else "rx" if _RX_RE.search(text) else "tx" if _TX_RE.search(text) else None
        if kind is None:
            found.unknown_kind.append(tree.label(idx))
            continue
        if stype == _WATTS and kind != "bias":
            if value < 0:
                found.negative.append(f"{port}/{kind}")
                continue
            value = watts_to_dbm(value)
        zero_based = lane is not None
        if lane is None:
            lane = tree.named_lane(chain, anchors)
        found.readings.append(_Reading(idx[0], tree.label(idx), port, lane, zero_based, kind, value,
                                       stype == _DBM))


def _place(found: _Found, optics: _Optics) -> list[str]:
    """Put lane readings on 0-based lanes; the names of those that cannot be placed."""
    seen: set[tuple[int, str]] = set()
    readings = []
    for r in found.readings:  # the same sensor in two MIBs (Cisco): the first table's reading
        if (r.index, r.kind) not in seen:
            seen.add((r.index, r.kind))
            readings.append(r)
    named = [r.lane for r in readings if r.lane is not None and not r.zero_based]
    base = 0 if not named or min(named) == 0 else 1
    by_kind: dict[tuple[str, str], list[_Reading]] = {}
    for r in readings:
        by_kind.setdefault((r.port, r.kind), []).append(r)
    unplaced: list[str] = []
    attr = {"rx": "rx_dbm", "tx": "tx_dbm", "bias": "bias_a"}
    for (port, kind), rs in by_kind.items():
        for r in rs:
            if r.lane is None and len(rs) > 1:  # lane-less beside others of its kind: which lane?
                unplaced.append(f"{r.name} (no lane in its name)")
                continue
            ln = 0 if r.lane is None else r.lane if r.zero_based else max(0, r.lane - base)
            lane = optics.lane(port, ln)
            lane.dbm_native = lane.dbm_native or r.native_dbm
            if getattr(lane, attr[kind]) is None:
                setattr(lane, attr[kind], r.value)
            else:
                unplaced.append(f"{r.name} (a second {kind} reading for {port} lane {ln})")
    return unplaced


def _warn(cells: Cells, what: str, items: list[str]) -> None:
    if items:
        cells.warn(f"optics: {len(items)} {what}: {', '.join(items[:6])}{' ...' if len(items) > 6 else ''}")


def _juniper(cells: Cells, ifindex_port: dict[int, str], optics: _Optics) -> None:
    e, lane_e = O.JNX_DOM_ENTRY, O.JNX_LANE_ENTRY
    lane_count = cells.ints((*e, O.JNX_LANE_COUNT))
    rx, tx = cells.ints((*e, O.JNX_RX_POWER)), cells.ints((*e, O.JNX_TX_POWER))
    bias, temp = cells.ints((*e, O.JNX_TX_BIAS)), cells.ints((*e, O.JNX_TEMP))
    volt = cells.ints((*e, O.JNX_VOLTAGE))
    lrx, ltx = cells.ints((*lane_e, O.JNX_LANE_RX_POWER)), cells.ints((*lane_e, O.JNX_LANE_TX_POWER))
    lbias = cells.ints((*lane_e, O.JNX_LANE_TX_BIAS))
    lanes_of: dict[int, list[int]] = {}
    for idx in lrx.keys() | ltx.keys() | lbias.keys():
        if len(idx) == 2:
            lanes_of.setdefault(idx[0], []).append(idx[1])
    for idx in rx.keys() | temp.keys() | lane_count.keys():
        ifindex = idx[0]
        port = ifindex_port.get(ifindex)
        if port is None or lane_count.get(idx) == 0:  # lane count 0: empty cage
            continue
        if idx in temp:
            optics.temperature.setdefault(port, float(temp[idx]))
        if idx in volt:
            optics.voltage.setdefault(port, volt[idx] / 1000.0)
        if ifindex in lanes_of:
            for ln in sorted(lanes_of[ifindex]):
                key = (ifindex, ln)
                _set_lane(optics.lane(port, ln), lrx.get(key), ltx.get(key), lbias.get(key))
        else:
            _set_lane(optics.lane(port, 0), rx.get(idx), tx.get(idx), bias.get(idx))


def _set_lane(lane: _Lane, rx: int | None, tx: int | None, bias_ua: int | None) -> None:
    """Juniper units: 0.01 dBm and 0.001 mA (µA)."""
    lane.dbm_native = True
    if rx is not None and lane.rx_dbm is None:
        lane.rx_dbm = max(DBM_FLOOR, rx / 100.0)
    if tx is not None and lane.tx_dbm is None:
        lane.tx_dbm = max(DBM_FLOOR, tx / 100.0)
    if bias_ua is not None and lane.bias_a is None:
        lane.bias_a = bias_ua * 1e-6


def optic_samples(cells: Cells, *, device: str, ts_ms: int, ifindex_port: dict[int, str],
                  port_names: dict[str, str], dialect: Dialect = GENERIC) -> list[Sample]:
    """All DOM samples the walked tables hold. `ifindex_port` maps ifIndex -> port label
    (ports only); `port_names` maps any interface name/descr -> port label."""
    optics = _Optics()
    tree = _EntityTree(cells, port_names, ifindex_port, dialect)
    found = _Found()
    _sensor_table(cells, tree, O.ENT_SENSOR_ENTRY, optics, found)
    _sensor_table(cells, tree, O.CISCO_SENSOR_ENTRY, optics, found)
    lanes_unplaced = _place(found, optics)
    _warn(cells, "optical power sensor(s) report a negative value (no reading), dropped", found.negative)
    _warn(cells, "transceiver sensor(s) could not be tied to a port, skipped", found.unplaced)
    _warn(cells, "transceiver lane reading(s) could not be placed on a lane, skipped", lanes_unplaced)
    _warn(cells, "transceiver power sensor(s) name neither Rx nor Tx, skipped", found.unknown_kind)
    _warn(cells, "transceiver sensor(s) give no reading (status not ok)", found.not_ok)
    _juniper(cells, ifindex_port, optics)
    return _emit(optics, cells, device, ts_ms)


def _emit(optics: _Optics, cells: Cells, device: str, ts_ms: int) -> list[Sample]:
    out: list[Sample] = []
    placeholder: list[str] = []
    for (port, ln), lane in sorted(optics.lanes.items()):
        if lane.dbm_native and lane.rx_dbm == 0 and lane.tx_dbm == 0 and not lane.bias_a:
            placeholder.append(f"{port}/{ln}")
            continue
        for metric, value in (("optic_rx_power_dbm", lane.rx_dbm), ("optic_tx_power_dbm", lane.tx_dbm),
                              ("optic_tx_bias_amperes", lane.bias_a)):
            if value is not None:
                out.append(Sample(metric, round(value, 6), ts_ms, device, port=port, lane=ln))
    if placeholder:
        cells.warn(f"optics: {len(placeholder)} lane(s) report 0 dBm rx, 0 dBm tx and 0 A bias "
                   f"(no optical monitoring, e.g. DAC), dropped: {', '.join(placeholder[:6])}"
                   f"{' ...' if len(placeholder) > 6 else ''}")
    out += _port_level("optic_temperature_celsius", optics.temperature.items(), device, ts_ms)
    out += _port_level("optic_voltage_volts", optics.voltage.items(), device, ts_ms)
    out += _port_level("device_temperature_celsius", optics.device_temps.items(), device, ts_ms)
    return out


def _port_level(metric: str, items: Iterable[tuple[str, float]], device: str, ts_ms: int) -> list[Sample]:
    return [Sample(metric, round(v, 6), ts_ms, device, port=p) for p, v in sorted(items)]
