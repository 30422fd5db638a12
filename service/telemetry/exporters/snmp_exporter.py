"""snmp_exporter -> catalogue: the `if_mib` module (IF-MIB, EtherLike-MIB) and a DOM module
over ENTITY-SENSOR-MIB.

Identity: snmp_exporter is scraped with the switch as `target`, and the usual relabelling
(docs/ecosystem.md) makes `instance` the switch's address or name, which names the device
(a switch). Ports: `ifName`, else `ifDescr` (the lookups of the generator's stock if_mib
module), must be an inventory port name.

IF-MIB objects, as the SNMP collector reads them (collectors/snmp.py): 64-bit HC counters first,
the 32-bit ones (rank 1, 32-bit wrap) where a device has no HC table; `ifHighSpeed` (Mb/s) over
`ifSpeed` (b/s, capped at 4.29 Gb/s); `ifOperStatus`/`ifAdminStatus` up(1) -> 1, anything else
-> 0; `ifLastChange` (TimeTicks, which snmp_exporter exports as they are, hundredths of a
second) -> seconds. Unicast packet counters are the packet counters, as in the SNMP collector.

DOM: `entPhySensorValue` with the lookups `entPhysicalDescr`, `entPhySensorType`,
`entPhySensorScale` and `entPhySensorPrecision` on `entPhysicalIndex` (the module in
docs/ecosystem.md). A sensor is a transceiver sensor when its description says which port it is
for (Arista: "DOM RX Power Sensor for Ethernet21"); the value is raw x scale x 10^-precision in
the sensor's unit, watts become dBm (0 W: -40 dBm, a dark lane), a negative power is no reading.
The lane is "Lane N"/"Channel N" in the description (0-based as Arista numbers them), else 0.
Other sensors (fans, chassis temperatures) stay unmapped: the catalogue keys component
temperatures by inventory port.
"""

from __future__ import annotations

import math
import re

from service.telemetry.exporters.base import DeviceKind, Labels, Match, PortBy, Reason, Unmapped, hosts_of

EXPORTER = "snmp_exporter"
_S = DeviceKind.SWITCH


def _updown(v: float) -> float:
    return 1.0 if v == 1 else 0.0


# object -> (catalogue metric, rank, scale, counter bits)
IF_MIB: dict[str, tuple[str, int, float, int | None]] = {
    "ifHCInOctets": ("port_rx_bytes_total", 0, 1.0, 64),
    "ifHCOutOctets": ("port_tx_bytes_total", 0, 1.0, 64),
    "ifInOctets": ("port_rx_bytes_total", 1, 1.0, 32),
    "ifOutOctets": ("port_tx_bytes_total", 1, 1.0, 32),
    "ifHCInUcastPkts": ("port_rx_packets_total", 0, 1.0, 64),
    "ifHCOutUcastPkts": ("port_tx_packets_total", 0, 1.0, 64),
    "ifInUcastPkts": ("port_rx_packets_total", 1, 1.0, 32),
    "ifOutUcastPkts": ("port_tx_packets_total", 1, 1.0, 32),
    "ifInErrors": ("port_rx_errors_total", 0, 1.0, 32),
    "ifOutErrors": ("port_tx_errors_total", 0, 1.0, 32),
    "ifInDiscards": ("port_rx_discards_total", 0, 1.0, 32),
    "ifOutDiscards": ("port_tx_discards_total", 0, 1.0, 32),
    "dot3StatsFCSErrors": ("port_rx_fcs_errors_total", 0, 1.0, 32),
    "ifOperStatus": ("port_oper_up", 0, 1.0, None),
    "ifAdminStatus": ("port_admin_up", 0, 1.0, None),
    "ifHighSpeed": ("port_speed_bits_per_second", 0, 1e6, None),
    "ifSpeed": ("port_speed_bits_per_second", 1, 1.0, None),
    "ifLastChange": ("port_last_change_seconds", 0, 0.01, None),
}

# ENTITY-SENSOR-MIB EntitySensorDataType / EntitySensorDataScale
_VOLTS_DC, _AMPERES, _WATTS, _CELSIUS, _DBM = 4, 5, 6, 8, 14
_SCALE = {1: -24, 2: -21, 3: -18, 4: -15, 5: -12, 6: -9, 7: -6, 8: -3, 9: 0, 10: 3, 11: 6, 12: 9, 13: 12, 14: 18,
          15: 15, 16: 21, 17: 24}
_FOR_PORT_RE = re.compile(r"\bfor\s+(\S+)\s*$", re.I)
_LANE_RE = re.compile(r"\b(?:lane|channel)\s*(\d+)", re.I)
_RX_RE = re.compile(r"\brx\b|receive", re.I)
_TX_RE = re.compile(r"\btx\b|transmit|output", re.I)
DBM_FLOOR = -40.0


def _port_labels(labels: Labels) -> tuple[PortBy, str, str] | None:
    name = labels.get("ifName") or ""
    descr = labels.get("ifDescr") or ""
    if not name and not descr:
        return None
    return (PortBy.IFNAME, name, descr)


def _watts_to_dbm(w: float) -> float | None:
    if w < 0:
        return None  # Arista's -1e9 sentinel and kin: no reading
    return DBM_FLOOR if w == 0 else max(DBM_FLOOR, 10 * math.log10(w * 1000))


def _dom(labels: Labels) -> Match | Unmapped:
    descr = labels.get("entPhysicalDescr", "")
    m = _FOR_PORT_RE.search(descr)
    if m is None:
        return Unmapped(Reason.UNMAPPED_METRIC, "entPhySensorValue: not a transceiver sensor (description "
                        "names no port)" if descr else "entPhySensorValue: no entPhysicalDescr lookup label")
    try:
        stype = int(labels.get("entPhySensorType", ""))
        exp = _SCALE[int(labels.get("entPhySensorScale", "9"))] - int(labels.get("entPhySensorPrecision", "0"))
    except (ValueError, KeyError):
        return Unmapped(Reason.MISSING_LABEL, "entPhySensorValue: entPhySensorType/Scale/Precision lookups "
                        "missing or not numeric")
    factor = 10.0 ** exp
    lane_m = _LANE_RE.search(descr)
    lane = int(lane_m.group(1)) if lane_m else 0
    port = (PortBy.NAME, m.group(1))
    hosts = hosts_of(labels)
    if stype in (_WATTS, _DBM):
        metric = ("optic_rx_power_dbm" if _RX_RE.search(descr) else
                  "optic_tx_power_dbm" if _TX_RE.search(descr) else None)
        if metric is None:
            return Unmapped(Reason.UNMAPPED_METRIC, "entPhySensorValue: a power sensor neither rx nor tx")
        if stype == _WATTS:
            return Match(metric, _S, hosts, port, lane=lane, value_fn=lambda v: _watts_to_dbm(v * factor))
        return Match(metric, _S, hosts, port, lane=lane, scale=factor)
    if stype == _AMPERES:
        return Match("optic_tx_bias_amperes", _S, hosts, port, lane=lane,
                     value_fn=lambda v: None if v < 0 else v * factor)
    if stype == _CELSIUS:
        return Match("optic_temperature_celsius", _S, hosts, port, scale=factor)
    if stype == _VOLTS_DC:
        return Match("optic_voltage_volts", _S, hosts, port, value_fn=lambda v: None if v <= 0 else v * factor)
    return Unmapped(Reason.UNMAPPED_METRIC, f"entPhySensorValue: sensor type {stype} is not a DOM quantity")


def match(name: str, labels: Labels) -> Match | Unmapped | None:
    if name == "entPhySensorValue":
        return _dom(labels)
    hit = IF_MIB.get(name)
    if hit is None:
        return None
    port = _port_labels(labels)
    if port is None:
        return Unmapped(Reason.MISSING_LABEL, f"{name}: no ifName or ifDescr label (the if_mib lookups)")
    metric, rank, scale, bits = hit
    return Match(metric, _S, hosts_of(labels), port, rank=rank, scale=scale, counter_bits=bits,
                 value_fn=_updown if metric in ("port_oper_up", "port_admin_up") else None)
