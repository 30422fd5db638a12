"""What to ask a switch for (path sets per platform) and what its answers mean (leaf -> canonical Sample).

The mapping table is the union of every platform's schema: a leaf is recognised by its
key-less path whatever path set asked for it, so JSON captures need no path set at all.
Vendor names stop here.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from collectors.gnmi_components import TIE_PATHS, PortTies
from collectors.gnmi_decode import Leaf, PathElem, float32
from service.telemetry import catalogue
from service.telemetry.samples import Sample


@dataclass(frozen=True, slots=True)
class PathSet:
    """Subscription paths for one platform: SAMPLE for counters and optics, ON_CHANGE for state."""

    name: str
    sample: tuple[str, ...]
    on_change: tuple[str, ...]
    ties: tuple[str, ...] = ()  # component-tree leaves that tie transceivers to ports (read once per connection)

    @property
    def all(self) -> tuple[str, ...]:
        return self.sample + self.on_change


_OC_COUNTERS = (
    "/interfaces/interface/state/counters",
    "/interfaces/interface/ethernet/state/counters",
)
_OC_OPTICS = (
    "/components/component/transceiver/physical-channels/channel/state",
    "/components/component/transceiver/state",
    "/components/component/state/temperature",
)
_OC_STATE = (
    "/interfaces/interface/state/oper-status",
    "/interfaces/interface/state/admin-status",
    "/interfaces/interface/ethernet/state/negotiated-port-speed",
)

PATH_SETS: dict[str, PathSet] = {
    "openconfig": PathSet("openconfig", _OC_COUNTERS + _OC_OPTICS, _OC_STATE, TIE_PATHS),
    # EOS also serves openconfig-qos queue counters; the decimal64 temperatures in the
    # fixtures come from /components/component/state/temperature.
    "arista": PathSet(
        "arista",
        _OC_COUNTERS + _OC_OPTICS + ("/qos/interfaces/interface/output/queues/queue/state/dropped-pkts",),
        _OC_STATE,
        TIE_PATHS,
    ),
    # SR Linux native model (origin srl_nokia-interfaces in the fixtures).
    "nokia": PathSet(
        "nokia",
        ("/interface/statistics", "/interface/ethernet/statistics", "/interface/transceiver"),
        ("/interface/oper-state", "/interface/admin-state"),
    ),
    # Junos native sensors seen in the fixtures: per-queue drops (qmon-sw) and per-lane optics.
    "juniper": PathSet(
        "juniper",
        _OC_COUNTERS + ("/junos/system/linecard/qmon-sw", "/junos/system/linecard/optics"),
        _OC_STATE[:2],
    ),
}


def path_set(name: str | None) -> PathSet:
    key = (name or "openconfig").lower()
    if key not in PATH_SETS:
        raise KeyError(f"unknown gNMI path_set {name!r}; known: {', '.join(sorted(PATH_SETS))}")
    return PATH_SETS[key]


# ---------------------------------------------------------------------------- conversions


class ValueProblem(ValueError):
    """A leaf we know, with a value that does not fit its metric."""


def to_number(v: object) -> float:
    """A leaf value as a float: numbers, decimal64, RFC 7951 numeric strings, IEEE bytes."""
    if isinstance(v, bool):
        raise ValueProblem(f"boolean {v} where a number was expected")
    if isinstance(v, int | float | Decimal):
        return float(v)
    if isinstance(v, str):
        try:
            return float(Decimal(v.strip()))  # JSON-IETF writes uint64 and decimal64 as strings
        except ArithmeticError as e:
            raise ValueProblem(f"string {v!r} is not a number") from e
    if isinstance(v, bytes):
        # Junos sends IEEE-754 floats in bytes_val, big-endian (telegraf #17154)
        if len(v) == 4:
            return float32(struct.unpack(">f", v)[0])
        if len(v) == 8:
            return struct.unpack(">d", v)[0]
        raise ValueProblem(f"{len(v)} bytes cannot be an IEEE float")
    raise ValueProblem(f"{type(v).__name__} {v!r} where a number was expected")


def _milli(v: object) -> float:
    return to_number(v) / 1000.0


_UP = {"UP", "ENABLE", "ENABLED", "TRUE"}
_DOWN = {"DOWN", "DISABLE", "DISABLED", "FALSE", "TESTING", "UNKNOWN", "DORMANT",
         "NOT_PRESENT", "LOWER_LAYER_DOWN", "EMPTY"}


def _updown(v: object) -> float:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, str) and v.strip().upper() in _UP | _DOWN:
        return 1.0 if v.strip().upper() in _UP else 0.0
    raise ValueProblem(f"{v!r} is not an oper/admin status")


_SPEED_RE = re.compile(r"^SPEED_(\d+)(MB|GB)$")


def _speed(v: object) -> float:
    # openconfig-if-ethernet ETHERNET_SPEED identities: SPEED_100GB, SPEED_800GB, SPEED_10MB
    if isinstance(v, str):
        m = _SPEED_RE.match(v.rsplit(":", 1)[-1].strip())
        if m:
            return float(m.group(1)) * (1e9 if m.group(2) == "GB" else 1e6)
        if v.strip().upper() == "SPEED_UNKNOWN":
            raise ValueProblem("speed is SPEED_UNKNOWN")
    raise ValueProblem(f"{v!r} is not an ethernet speed")


# ---------------------------------------------------------------------------- rules

Key = tuple[str, str]  # (list node name, key name)


@dataclass(frozen=True, slots=True)
class Rule:
    metric: str
    port: Key
    conv: Callable[[object], float] = to_number
    lane: Key | None = None
    priority: Key | None = None
    # Several leaves that add up to one metric (e.g. tail + RED drops); emitted only when
    # the whole group arrived in one notification, so a partial update never looks like a reset.
    group: tuple[str, ...] = field(default_factory=tuple)


_IF, _COMP, _SRL = ("interface", "name"), ("component", "name"), ("interface", "name")
_QOS_IF, _QUEUE = ("interface", "interface-id"), ("queue", "name")
_CHAN, _LANE = ("channel", "index"), ("lane", "lane_number")
_QMON_PORT, _QMON_Q = ("qmon-sw", "name"), ("egress", "queue-number")

_OC_CTR = "interfaces/interface/state/counters/"
_OC_ETH = "interfaces/interface/ethernet/state/"
_OC_CH = "components/component/transceiver/physical-channels/channel/state/"
_SRL_ST = "interface/statistics/"
_SRL_TR = "interface/transceiver/"
_JQ = "junos/system/linecard/qmon-sw/egress/"
_JQ_DROPS = tuple(
    _JQ + leaf for leaf in ("tail-drop-packets",) + tuple(f"red-drop-packets-color-{c}" for c in range(4))
)
_JO = "interfaces/interface/optics/"

RULES: dict[str, Rule] = {
    # openconfig-interfaces
    _OC_CTR + "in-octets": Rule("port_rx_bytes_total", _IF),
    _OC_CTR + "out-octets": Rule("port_tx_bytes_total", _IF),
    _OC_CTR + "in-pkts": Rule("port_rx_packets_total", _IF),
    _OC_CTR + "out-pkts": Rule("port_tx_packets_total", _IF),
    _OC_CTR + "in-errors": Rule("port_rx_errors_total", _IF),
    _OC_CTR + "out-errors": Rule("port_tx_errors_total", _IF),
    _OC_CTR + "in-discards": Rule("port_rx_discards_total", _IF),
    _OC_CTR + "out-discards": Rule("port_tx_discards_total", _IF),
    _OC_CTR + "in-fcs-errors": Rule("port_rx_fcs_errors_total", _IF),
    _OC_CTR + "carrier-transitions": Rule("port_carrier_changes_total", _IF),
    "interfaces/interface/state/oper-status": Rule("port_oper_up", _IF, _updown),
    "interfaces/interface/state/admin-status": Rule("port_admin_up", _IF, _updown),
    # openconfig-if-ethernet
    _OC_ETH + "counters/in-mac-pause-frames": Rule("port_rx_pause_frames_total", _IF),
    _OC_ETH + "counters/out-mac-pause-frames": Rule("port_tx_pause_frames_total", _IF),
    _OC_ETH + "negotiated-port-speed": Rule("port_speed_bits_per_second", _IF, _speed),
    # openconfig-platform-transceiver
    _OC_CH + "input-power/instant": Rule("optic_rx_power_dbm", _COMP, lane=_CHAN),
    _OC_CH + "output-power/instant": Rule("optic_tx_power_dbm", _COMP, lane=_CHAN),
    _OC_CH + "laser-bias-current/instant": Rule("optic_tx_bias_amperes", _COMP, _milli, lane=_CHAN),
    "components/component/transceiver/state/pre-fec-ber/instant": Rule("port_pre_fec_ber", _COMP),
    "components/component/transceiver/state/supply-voltage/instant": Rule("optic_voltage_volts", _COMP),
    # metric chosen per component below: a transceiver's case or another component
    "components/component/state/temperature/instant": Rule("device_temperature_celsius", _COMP),
    # openconfig-qos
    "qos/interfaces/interface/output/queues/queue/state/dropped-pkts":
        Rule("port_queue_drops_total", _QOS_IF, priority=_QUEUE),
    # Nokia SR Linux
    _SRL_ST + "in-octets": Rule("port_rx_bytes_total", _SRL),
    _SRL_ST + "out-octets": Rule("port_tx_bytes_total", _SRL),
    _SRL_ST + "in-packets": Rule("port_rx_packets_total", _SRL),
    _SRL_ST + "out-packets": Rule("port_tx_packets_total", _SRL),
    _SRL_ST + "in-error-packets": Rule("port_rx_errors_total", _SRL),
    _SRL_ST + "out-error-packets": Rule("port_tx_errors_total", _SRL),
    _SRL_ST + "in-discarded-packets": Rule("port_rx_discards_total", _SRL),
    _SRL_ST + "out-discarded-packets": Rule("port_tx_discards_total", _SRL),
    _SRL_ST + "in-fcs-error-packets": Rule("port_rx_fcs_errors_total", _SRL),
    "interface/ethernet/statistics/in-mac-pause-frames": Rule("port_rx_pause_frames_total", _SRL),
    "interface/ethernet/statistics/out-mac-pause-frames": Rule("port_tx_pause_frames_total", _SRL),
    "interface/oper-state": Rule("port_oper_up", _SRL, _updown),
    "interface/admin-state": Rule("port_admin_up", _SRL, _updown),
    _SRL_TR + "channel/input-power/latest-value": Rule("optic_rx_power_dbm", _SRL, lane=_CHAN),
    _SRL_TR + "channel/output-power/latest-value": Rule("optic_tx_power_dbm", _SRL, lane=_CHAN),
    _SRL_TR + "channel/laser-bias-current/latest-value":
        Rule("optic_tx_bias_amperes", _SRL, _milli, lane=_CHAN),
    _SRL_TR + "temperature/latest-value": Rule("optic_temperature_celsius", _SRL),
    _SRL_TR + "voltage/latest-value": Rule("optic_voltage_volts", _SRL),
    # Junos native optics (/junos/system/linecard/optics, rooted at interfaces/interface)
    _JO + "module_temp": Rule("optic_temperature_celsius", _IF),
    _JO + "lanediags/lane/lane_laser_output_power_dbm": Rule("optic_tx_power_dbm", _IF, lane=_LANE),
    _JO + "lanediags/lane/lane_laser_receiver_power_dbm": Rule("optic_rx_power_dbm", _IF, lane=_LANE),
    _JO + "lanediags/lane/lane_laser_bias_current": Rule("optic_tx_bias_amperes", _IF, _milli, lane=_LANE),
}
for _leaf in _JQ_DROPS:
    RULES[_leaf] = Rule("port_queue_drops_total", _QMON_PORT, priority=_QMON_Q, group=_JQ_DROPS)

for _r in RULES.values():  # the catalogue is the only vocabulary
    assert catalogue.get(_r.metric) is not None, _r.metric


# ---------------------------------------------------------------------------- mapping


@dataclass(slots=True)
class MapResult:
    samples: list[Sample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # known leaves with values we could not use
    unmapped: list[str] = field(default_factory=list)  # leaves no rule knows


def _key(path: tuple[PathElem, ...], where: Key) -> str | None:
    for e in path:
        if e.name == where[0]:
            return e.key(where[1])
    return None


def _clean_name(v: object) -> str | None:
    # Some devices quote the name leaf (`"1"`, even `\"1\`, telegraf #14063/#16476)
    if not isinstance(v, str):
        return None
    s = v.strip().strip('\\"').strip()
    return s or None


def _sibling_name(leaf: Leaf, leaves: list[Leaf]) -> str | None:
    """The `name` leaf in the same container: the only interface identity some devices send."""
    parent = leaf.path[:-1]
    for other in leaves:
        if other.path[:-1] == parent and other.path[-1].name == "name":
            return _clean_name(other.value)
    return None


def _int_key(raw: str | None) -> int | None:
    if raw is None:
        return None
    m = re.search(r"(\d+)$", raw)  # queue names like "7" or "UC7"
    return int(m.group(1)) if m else None


def map_notification(leaves: list[Leaf], *, device: str, fallback_ts_ms: int | None = None,
                     ties: PortTies | None = None) -> MapResult:
    """Turn the leaves of one notification into canonical samples.

    `ties` is what the device said about its component tree (gnmi_components.py); without
    it, the tie leaves in this notification are used, then component names.
    """
    out = MapResult()
    if ties is None:
        ties = PortTies()
        ties.learn(leaves)
    untied: set[str] = set()
    groups: dict[tuple[str, str, int | None, int | None, int], list[float]] = {}
    group_size: dict[tuple[str, str, int | None, int | None, int], int] = {}
    for leaf in leaves:
        rule = RULES.get(leaf.schema)
        if rule is None:
            out.unmapped.append(leaf.text())
            continue
        ts_ms = leaf.ts_ns // 1_000_000 if leaf.ts_ns > 0 else fallback_ts_ms
        if ts_ms is None:
            out.problems.append(f"{leaf.text()}: no timestamp")
            continue
        port = _key(leaf.path, rule.port)
        if port is None:
            port = _sibling_name(leaf, leaves)
        if port is None:
            out.problems.append(f"{leaf.text()}: no interface name (no key and no name leaf)")
            continue
        metric = rule.metric
        if rule.port == _COMP:
            if metric == "device_temperature_celsius" and ties.is_transceiver(port):
                metric = "optic_temperature_celsius"  # a module's case temperature
            if metric != "device_temperature_celsius":
                tied, _how = ties.port_of(port)
                if tied is None:
                    untied.add(port)
                    continue
                port = tied
        lane = _int_key(_key(leaf.path, rule.lane)) if rule.lane else None
        prio = _int_key(_key(leaf.path, rule.priority)) if rule.priority else None
        if (rule.lane and lane is None) or (rule.priority and prio is None):
            out.problems.append(f"{leaf.text()}: lane or queue key missing or not numeric")
            continue
        try:
            value = rule.conv(leaf.value)
        except ValueProblem as e:
            out.problems.append(f"{leaf.text()}: {e}")
            continue
        if math.isnan(value):
            out.problems.append(f"{leaf.text()}: value is NaN")
            continue
        if rule.group:
            k = (metric, port, lane, prio, ts_ms)
            groups.setdefault(k, []).append(value)
            group_size[k] = len(rule.group)
            continue
        out.samples.append(Sample(metric, value, ts_ms, device, port=port, lane=lane, priority=prio))
    out.problems += [f"component {c!r}: not tied to a port (no interface transceiver or hardware-port leaf "
                     f"reaches it, and its name fits no known pattern); its readings are dropped"
                     for c in sorted(untied)]
    for (metric, port, lane, prio, ts_ms), vals in groups.items():
        if len(vals) == group_size[(metric, port, lane, prio, ts_ms)]:
            out.samples.append(Sample(metric, sum(vals), ts_ms, device, port=port, lane=lane, priority=prio))
        else:
            out.problems.append(f"{metric} {port} queue {prio}: only {len(vals)} of "
                                f"{group_size[(metric, port, lane, prio, ts_ms)]} parts in one notification")
    return out


def map_notifications(groups: Iterable[list[Leaf]], *, device: str,
                      fallback_ts_ms: int | None = None) -> MapResult:
    groups = list(groups)
    ties = PortTies()  # a capture's tie leaves may sit in any of its notifications
    for leaves in groups:
        ties.learn(leaves)
    total = MapResult()
    for leaves in groups:
        r = map_notification(leaves, device=device, fallback_ts_ms=fallback_ts_ms, ties=ties)
        total.samples += r.samples
        total.problems += r.problems
        total.unmapped += r.unmapped
    return total
