"""Optics (DOM) over SNMP: ENTITY-SENSOR-MIB, CISCO-ENTITY-SENSOR-MIB and JUNIPER-DOM-MIB.

Every reading ends as a canonical optic_* sample in base units: dBm for optical
power, amperes, celsius and volts. Rules, each taken from what the real walks in
tests/data/real/snmp contain:

* A sensor belongs to a port through ENTITY-MIB: its entPhysicalContainedIn chain
  reaches an entity with an entAliasMapping to an ifIndex (Cisco), or one of the
  sensor's or its ancestors' descriptions names a known interface ("DOM RX Power
  Sensor for Ethernet21" on Arista, "Ethernet1/25 Lane 1 Transceiver ..." on Cisco).
* A sensor is an optic sensor when its chain mentions a transceiver (Xcvr,
  Transceiver, DOM, optic). Other celsius sensors become device_temperature_celsius
  with `port` naming the component.
* Lanes are 0-based. Arista numbers lanes from 0, Cisco from 1; the base is taken per
  device from the lowest lane number it shows. A module without lane entities is lane 0.
* Watts become dBm; 0 W (no light) clamps at -40 dBm. A negative power (Arista's
  -1000000000 sentinel for "no reading") is dropped with a warning, not clamped:
  it is an absent reading, not a dark receiver.
* Sources that report dBm natively (Cisco type dBm, Juniper) send 0 dBm, 0 dBm and
  0 A for modules without optical monitoring (DACs, empty lanes). Such an all-zero
  lane is dropped with a warning: 1 mW of light with no bias current is not physics.
* Sensors whose status is not ok(1) are skipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from collectors import snmp_oids as O
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
_LANE_RE = re.compile(r"\blane\s*(\d+)", re.I)
_RX_RE = re.compile(r"\brx\b|receive", re.I)
_TX_RE = re.compile(r"\btx\b|transmit|output", re.I)
_TOKEN_STRIP = "()[]{},;\"'"


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


class _EntityTree:
    """ENTITY-MIB names, containment and alias mapping, for finding a sensor's port."""

    def __init__(self, cells: Cells, port_names: dict[str, str], ifindex_port: dict[int, str]) -> None:
        self.cells = cells
        self.port_names = port_names  # any interface name or descr -> port label
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

    def port_of(self, chain: list[Oid]) -> str | None:
        for e in chain:
            if e in self.alias:
                return self.alias[e]
        for e in chain:
            for text in self.texts(e):
                for tok in text.split():
                    port = self.port_names.get(tok.strip(_TOKEN_STRIP))
                    if port:
                        return port
        return None

    def lane_of(self, chain: list[Oid]) -> int | None:
        for e in chain:
            for text in self.texts(e):
                m = _LANE_RE.search(text)
                if m:
                    return int(m.group(1))
        return None

    def is_xcvr(self, chain: list[Oid]) -> bool:
        return any(_XCVR_RE.search(t) for e in chain for t in self.texts(e))


def _sensor_table(cells: Cells, tree: _EntityTree, entry: Oid, optics: _Optics,
                  raw_lanes: list[tuple[str, int | None, str, float, bool]], source: str) -> None:
    """Read one ENTITY-SENSOR-shaped table into raw lane readings and port readings."""
    types = cells.ints((*entry, O.SENSOR_TYPE))
    scales = cells.ints((*entry, O.SENSOR_SCALE))
    precs = cells.ints((*entry, O.SENSOR_PRECISION))
    values = cells.ints((*entry, O.SENSOR_VALUE))
    status = cells.ints((*entry, O.SENSOR_STATUS))
    negative: list[str] = []
    unplaced = 0
    for idx, stype in types.items():
        if stype not in (_VOLTS_DC, _AMPERES, _WATTS, _CELSIUS, _DBM) or idx not in values:
            continue
        if status.get(idx, _STATUS_OK) != _STATUS_OK:
            continue
        scale = _SCALE.get(scales.get(idx, 9))
        if scale is None:
            cells.warn(f"{source} sensor {idx[0]}: unknown scale {scales.get(idx)}; skipped")
            continue
        value = values[idx] * scale * 10.0 ** (-precs.get(idx, 0))
        chain = tree.chain(idx)
        xcvr = tree.is_xcvr(chain)
        port = tree.port_of(chain) if xcvr else None
        if stype == _CELSIUS and not xcvr:
            label = tree.name.get(idx) or tree.descr.get(idx) or f"sensor {idx[0]}"
            if label in optics.device_temps:  # names repeat ("Board temp sensor" twice on Arista)
                label = f"{label} {idx[0]}"
            optics.device_temps[label] = value
            continue
        if not xcvr:
            continue
        if port is None:
            unplaced += 1
            continue
        if stype == _CELSIUS:
            optics.temperature.setdefault(port, value)
        elif stype == _VOLTS_DC:
            optics.voltage.setdefault(port, value)
        else:
            text = " ".join(tree.texts(idx))
            if stype == _AMPERES:
                kind = "bias"
            elif _RX_RE.search(text):
                kind = "rx"
            elif _TX_RE.search(text):
                kind = "tx"
            else:
                continue
            if stype == _WATTS and kind != "bias":
                if value < 0:
                    negative.append(f"{port}/{kind}")
                    continue
                value = watts_to_dbm(value)
            raw_lanes.append((port, tree.lane_of(chain), kind, value, stype == _DBM))
    if negative:
        cells.warn(f"{source}: {len(negative)} optical power sensor(s) report a negative value "
                   f"(no reading), dropped: {', '.join(negative[:6])}{' ...' if len(negative) > 6 else ''}")
    if unplaced:
        cells.warn(f"{source}: {unplaced} transceiver sensor(s) could not be tied to a port; skipped")


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
                  port_names: dict[str, str]) -> list[Sample]:
    """All DOM samples the walked tables hold. `ifindex_port` maps ifIndex -> port label
    (for every interface); `port_names` maps any interface name/descr -> port label."""
    optics = _Optics()
    tree = _EntityTree(cells, port_names, ifindex_port)
    raw: list[tuple[str, int | None, str, float, bool]] = []
    _sensor_table(cells, tree, O.ENT_SENSOR_ENTRY, optics, raw, "ENTITY-SENSOR-MIB")
    _sensor_table(cells, tree, O.CISCO_SENSOR_ENTRY, optics, raw, "CISCO-ENTITY-SENSOR-MIB")
    # Lane base per device: 0 if any lane 0 is shown, else lanes count from 1.
    shown = [ln for _, ln, _, _, _ in raw if ln is not None]
    base = 0 if not shown or min(shown) == 0 else 1
    for port, ln, kind, value, native in raw:
        lane = optics.lane(port, 0 if ln is None else max(0, ln - base))
        lane.dbm_native = lane.dbm_native or native
        attr = {"rx": "rx_dbm", "tx": "tx_dbm", "bias": "bias_a"}[kind]
        if getattr(lane, attr) is None:
            setattr(lane, attr, value)
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
        cells.warn(f"DOM: {len(placeholder)} lane(s) report 0 dBm rx, 0 dBm tx and 0 A bias "
                   f"(no optical monitoring, e.g. DAC), dropped: {', '.join(placeholder[:6])}"
                   f"{' ...' if len(placeholder) > 6 else ''}")
    out += _port_level("optic_temperature_celsius", optics.temperature.items(), device, ts_ms)
    out += _port_level("optic_voltage_volts", optics.voltage.items(), device, ts_ms)
    out += _port_level("device_temperature_celsius", optics.device_temps.items(), device, ts_ms)
    return out


def _port_level(metric: str, items: Iterable[tuple[str, float]], device: str, ts_ms: int) -> list[Sample]:
    return [Sample(metric, round(v, 6), ts_ms, device, port=p) for p, v in sorted(items)]
