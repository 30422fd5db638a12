"""Numeric OIDs the SNMP collector reads, and the column sets it walks.

Numeric only: nothing here needs a MIB compiler at run time. Names follow the MIBs
(IF-MIB, EtherLike-MIB, ENTITY-MIB, ENTITY-SENSOR-MIB, CISCO-ENTITY-SENSOR-MIB,
JUNIPER-DOM-MIB, LLDP-MIB) so a reader can look each one up.
"""

from __future__ import annotations

Oid = tuple[int, ...]


def oid(text: str) -> Oid:
    """'1.3.6.1' -> (1, 3, 6, 1); a leading dot is allowed."""
    return tuple(int(p) for p in text.strip(".").split("."))


# SNMPv2-MIB system scalars (.0): which OS answers (collectors/snmp_dialects.py)
SYS_DESCR, SYS_OBJECT_ID = oid("1.3.6.1.2.1.1.1"), oid("1.3.6.1.2.1.1.2")

# IF-MIB ifTable (1.3.6.1.2.1.2.2.1.<col>.<ifIndex>)
IF_ENTRY = oid("1.3.6.1.2.1.2.2.1")
IF_DESCR, IF_TYPE, IF_ADMIN, IF_OPER, IF_LAST_CHANGE = 2, 3, 7, 8, 9
IF_IN_DISCARDS, IF_IN_ERRORS, IF_OUT_DISCARDS, IF_OUT_ERRORS = 13, 14, 19, 20

# IF-MIB ifXTable (1.3.6.1.2.1.31.1.1.1.<col>.<ifIndex>)
IFX_ENTRY = oid("1.3.6.1.2.1.31.1.1.1")
IFX_NAME = 1
IFX_HC_IN_OCTETS, IFX_HC_IN_UCAST, IFX_HC_IN_MCAST, IFX_HC_IN_BCAST = 6, 7, 8, 9
IFX_HC_OUT_OCTETS, IFX_HC_OUT_UCAST, IFX_HC_OUT_MCAST, IFX_HC_OUT_BCAST = 10, 11, 12, 13
IFX_HIGH_SPEED, IFX_CONNECTOR_PRESENT, IFX_ALIAS = 15, 17, 18

# EtherLike-MIB dot3StatsTable (1.3.6.1.2.1.10.7.2.1.<col>.<ifIndex>)
DOT3_ENTRY = oid("1.3.6.1.2.1.10.7.2.1")
DOT3_FCS_ERRORS = 3

# ENTITY-MIB entPhysicalTable (1.3.6.1.2.1.47.1.1.1.1.<col>.<entIndex>)
ENT_PHYS_ENTRY = oid("1.3.6.1.2.1.47.1.1.1.1")
ENT_DESCR, ENT_CONTAINED_IN, ENT_CLASS, ENT_NAME = 2, 4, 5, 7
# entAliasMappingIdentifier (…47.1.3.2.1.2.<entIndex>.<logicalIndex>) -> ifIndex OID
ENT_ALIAS_ID = oid("1.3.6.1.2.1.47.1.3.2.1.2")
ENT_CLASS_PORT = 10  # PhysicalClass port(10); module(9), sensor(8)

# ENTITY-SENSOR-MIB entPhySensorTable (1.3.6.1.2.1.99.1.1.1.<col>.<entIndex>)
ENT_SENSOR_ENTRY = oid("1.3.6.1.2.1.99.1.1.1")
# CISCO-ENTITY-SENSOR-MIB entSensorValueTable (1.3.6.1.4.1.9.9.91.1.1.1.1.<col>.<entIndex>)
CISCO_SENSOR_ENTRY = oid("1.3.6.1.4.1.9.9.91.1.1.1.1")
# Both tables share the column layout for what we read.
SENSOR_TYPE, SENSOR_SCALE, SENSOR_PRECISION, SENSOR_VALUE, SENSOR_STATUS = 1, 2, 3, 4, 5

# JUNIPER-DOM-MIB jnxDomCurrentTable (…2636.3.60.1.1.1.1.<col>.<ifIndex>)
JNX_DOM_ENTRY = oid("1.3.6.1.4.1.2636.3.60.1.1.1.1")
JNX_RX_POWER, JNX_TX_BIAS, JNX_TX_POWER, JNX_TEMP = 5, 6, 7, 8  # 0.01 dBm, 0.001 mA, 0.01 dBm, C
JNX_VOLTAGE, JNX_LANE_COUNT = 25, 30  # 0.001 V
# JUNIPER-DOM-MIB jnxDomModuleLaneTable (…2636.3.60.1.2.1.1.<col>.<ifIndex>.<lane>)
JNX_LANE_ENTRY = oid("1.3.6.1.4.1.2636.3.60.1.2.1.1")
JNX_LANE_RX_POWER, JNX_LANE_TX_BIAS, JNX_LANE_TX_POWER = 6, 7, 8

# LLDP-MIB (IEEE 802.1AB-2005)
LLDP_LOC_PORT_ENTRY = oid("1.0.8802.1.1.2.1.3.7.1")  # .<col>.<localPortNum>
LLDP_LOC_PORT_ID, LLDP_LOC_PORT_DESC = 3, 4
LLDP_REM_ENTRY = oid("1.0.8802.1.1.2.1.4.1.1")  # .<col>.<timeMark>.<localPortNum>.<index>
LLDP_REM_CHASSIS_ID, LLDP_REM_PORT_ID_SUBTYPE, LLDP_REM_PORT_ID = 5, 6, 7
LLDP_REM_PORT_DESC, LLDP_REM_SYS_NAME = 8, 9


def columns(entry: Oid, *cols: int) -> list[Oid]:
    return [(*entry, c) for c in cols]


# What one poll walks, as groups of table columns. Columns of one group share an
# index, so one GETBULK carries a whole row of each.
WALK_GROUPS: dict[str, list[Oid]] = {
    "system": [SYS_DESCR, SYS_OBJECT_ID],
    "if": columns(IF_ENTRY, IF_DESCR, IF_TYPE, IF_ADMIN, IF_OPER, IF_LAST_CHANGE,
                  IF_IN_DISCARDS, IF_IN_ERRORS, IF_OUT_DISCARDS, IF_OUT_ERRORS),
    "ifx": columns(IFX_ENTRY, IFX_NAME, IFX_HC_IN_OCTETS, IFX_HC_IN_UCAST, IFX_HC_IN_MCAST,
                   IFX_HC_IN_BCAST, IFX_HC_OUT_OCTETS, IFX_HC_OUT_UCAST, IFX_HC_OUT_MCAST,
                   IFX_HC_OUT_BCAST, IFX_HIGH_SPEED, IFX_CONNECTOR_PRESENT, IFX_ALIAS),
    "dot3": columns(DOT3_ENTRY, DOT3_FCS_ERRORS),
    "entity": columns(ENT_PHYS_ENTRY, ENT_DESCR, ENT_CONTAINED_IN, ENT_CLASS, ENT_NAME),
    "ent_alias": [ENT_ALIAS_ID],
    "ent_sensor": columns(ENT_SENSOR_ENTRY, SENSOR_TYPE, SENSOR_SCALE, SENSOR_PRECISION,
                          SENSOR_VALUE, SENSOR_STATUS),
    "cisco_sensor": columns(CISCO_SENSOR_ENTRY, SENSOR_TYPE, SENSOR_SCALE, SENSOR_PRECISION,
                            SENSOR_VALUE, SENSOR_STATUS),
    "jnx_dom": columns(JNX_DOM_ENTRY, JNX_RX_POWER, JNX_TX_BIAS, JNX_TX_POWER, JNX_TEMP,
                       JNX_VOLTAGE, JNX_LANE_COUNT),
    "jnx_lane": columns(JNX_LANE_ENTRY, JNX_LANE_RX_POWER, JNX_LANE_TX_BIAS, JNX_LANE_TX_POWER),
    "lldp_loc": columns(LLDP_LOC_PORT_ENTRY, LLDP_LOC_PORT_ID, LLDP_LOC_PORT_DESC),
    "lldp_rem": columns(LLDP_REM_ENTRY, LLDP_REM_CHASSIS_ID, LLDP_REM_PORT_ID_SUBTYPE,
                        LLDP_REM_PORT_ID, LLDP_REM_PORT_DESC, LLDP_REM_SYS_NAME),
}

# Groups polled by default; `target.params["groups"]` may narrow this list.
DEFAULT_GROUPS: tuple[str, ...] = tuple(WALK_GROUPS)


# ---------------------------------------------------------------------------
# Varbinds and the table view of them

# (oid, asn1 type name, value). Value: int for numeric types, bytes for
# OctetString/Opaque, dotted text for ObjectIdentifier and IpAddress, None for
# Null and the v2 exceptions (NoSuchObject, NoSuchInstance, EndOfMibView).
Value = int | bytes | str | None
Varbind = tuple[Oid, str, Value]

INT_TYPES = frozenset({"Integer", "Counter32", "Gauge32", "TimeTicks", "Counter64"})
COUNTER_BITS = {"Counter32": 32, "Counter64": 64}

_ALL_COLUMNS: frozenset[Oid] = frozenset(c for cols in WALK_GROUPS.values() for c in cols)
_COLUMN_LENGTHS: tuple[int, ...] = tuple(sorted({len(c) for c in _ALL_COLUMNS}))


def dotted(o: Oid) -> str:
    return ".".join(map(str, o))


def text_of(value: Value) -> str:
    """Octet strings as text when they are printable UTF-8, else colon-separated hex (MACs)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        try:
            s = value.decode("utf-8").rstrip("\x00")
        except UnicodeDecodeError:
            return value.hex(":")
        return s if s.isprintable() else value.hex(":")
    return str(value)


class Cells:
    """Varbinds of the columns we know, by column then row index; collects warnings.

    Accessors return only well-typed cells. A cell of the wrong type (a garbled agent
    answer) is left out and named in one warning per column.
    """

    def __init__(self, varbinds: list[Varbind]) -> None:
        self.warnings: list[str] = []
        self._cols: dict[Oid, dict[Oid, tuple[str, Value]]] = {}
        for o, typ, val in varbinds:
            for n in _COLUMN_LENGTHS:
                col = o[:n]
                if col in _ALL_COLUMNS:
                    self._cols.setdefault(col, {})[o[n:]] = (typ, val)
                    break

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def has(self, col: Oid) -> bool:
        return bool(self._cols.get(col))

    def typed_ints(self, col: Oid) -> dict[Oid, tuple[str, int]]:
        out: dict[Oid, tuple[str, int]] = {}
        bad: list[str] = []
        for idx, (typ, val) in self._cols.get(col, {}).items():
            if typ in INT_TYPES and isinstance(val, int):
                out[idx] = (typ, val)
            elif typ not in ("NoSuchObject", "NoSuchInstance", "EndOfMibView", "Null"):
                bad.append(f"{dotted(col + idx)} = {typ} {val!r:.40}")
        if bad:
            self.warn(f"garbled value(s) in column {dotted(col)}, expected a number: {bad[0]}"
                      + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "") + "; skipped")
        return out

    def ints(self, col: Oid) -> dict[Oid, int]:
        return {idx: v for idx, (_, v) in self.typed_ints(col).items()}

    def texts(self, col: Oid) -> dict[Oid, str]:
        return {idx: text_of(val) for idx, (_, val) in self._cols.get(col, {}).items()}

    def raw(self, col: Oid) -> dict[Oid, tuple[str, Value]]:
        return self._cols.get(col, {})


# ---------------------------------------------------------------------------
# Which poll groups (service.telemetry.targets.GROUPS) need which column. Columns not
# listed (sysDescr, sysObjectID, ifDescr, ifType, ifName, ifAlias, ifConnectorPresent) say
# which OS answers and which interfaces are ports, so every poll reads them.
_STATE = frozenset({"state"})
_COUNTERS = frozenset({"counters"})
_OPTICS = frozenset({"optics"})
COLUMN_POLL_GROUPS: dict[Oid, frozenset[str]] = {
    **{c: _STATE for c in columns(IF_ENTRY, IF_ADMIN, IF_OPER, IF_LAST_CHANGE)},
    (*IFX_ENTRY, IFX_HIGH_SPEED): _STATE,
    **{c: _COUNTERS for c in columns(IF_ENTRY, IF_IN_DISCARDS, IF_IN_ERRORS, IF_OUT_DISCARDS, IF_OUT_ERRORS)},
    **{c: _COUNTERS for c in columns(IFX_ENTRY, IFX_HC_IN_OCTETS, IFX_HC_IN_UCAST, IFX_HC_IN_MCAST,
                                     IFX_HC_IN_BCAST, IFX_HC_OUT_OCTETS, IFX_HC_OUT_UCAST, IFX_HC_OUT_MCAST,
                                     IFX_HC_OUT_BCAST)},
    (*DOT3_ENTRY, DOT3_FCS_ERRORS): _COUNTERS,
    **{c: _OPTICS for g in ("jnx_dom", "jnx_lane") for c in WALK_GROUPS[g]},
    **{c: _STATE for g in ("lldp_loc", "lldp_rem") for c in WALK_GROUPS[g]},
}
# ENTITY-MIB and the sensor tables: optics, and also device temperatures (which the
# collector assigns to their poll group at run time, from the catalogue's rule).
DEVICE_TEMP_COLUMNS: frozenset[Oid] = frozenset(
    c for g in ("entity", "ent_alias", "ent_sensor", "cisco_sensor") for c in WALK_GROUPS[g])
