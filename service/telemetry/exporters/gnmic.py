"""gnmic's Prometheus output -> catalogue.

gnmic names a metric after the gNMI path, its elements joined by `_` with every character that is
not a letter or digit made `_`, behind an optional prefix (`metric-prefix`, the subscription name
with `append-subscription-name`, an origin such as `openconfig_interfaces_`):
`/interfaces/interface[name=Ethernet1]/state/counters/in-octets` from subscription `sub1` is
`interfaces_interface_state_counters_in_octets{interface_name="Ethernet1",source="10.0.0.1:6030",
subscription_name="sub1"}` (or `gnmic_sub1_interfaces_...`). Path keys become `<element>_<key>` labels.

The leaves are those of the gNMI collector's table (collectors/gnmi_paths.py RULES), recognised by
the name's tail, so every prefix works; values are converted as that collector converts them
(laser bias mA -> A). Only numeric leaves reach Prometheus: oper/admin status and the ethernet
speed identity are strings and gnmic drops them (unless `strings-as-labels`); they stay unmapped.

Identity: `source` (the gNMI target, as written in gnmic's config: an address or a name) names the
device, never `instance`, which is gnmic itself. Ports: `interface_name`, or `component_name` for
transceiver leaves, as inventory port names (as on Arista, whose transceiver components are named
after their port); lanes from `channel_index`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from collectors.gnmi_paths import RULES, ValueProblem
from collectors.gnmi_paths import Rule as GnmiRule
from service.telemetry.exporters.base import (
    DeviceKind,
    Labels,
    Match,
    PortBy,
    Reason,
    Unmapped,
    hosts_of,
    int_label,
)

EXPORTER = "gnmic"


def _sanitize(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", path)


# numeric leaves only: gnmic exports no strings as values; grouped leaves need a whole notification
_TAILS: dict[str, tuple[str, GnmiRule]] = {
    _sanitize(path): (path, rule) for path, rule in RULES.items()
    if not rule.group and rule.conv.__name__ in ("to_number", "_milli")
    and rule.metric != "device_temperature_celsius"  # components are tied to ports by the component tree
}
_TAIL_RE = re.compile(r"(?:^|_)(" + "|".join(sorted(map(re.escape, _TAILS), key=len, reverse=True)) + r")\Z")


def _label(key: tuple[str, str]) -> str:
    return _sanitize(f"{key[0]}_{key[1]}")


@lru_cache(maxsize=4096)
def leaf_of(name: str) -> tuple[str, GnmiRule] | None:
    """The gNMI leaf (path, rule) a gnmic metric name ends with."""
    m = _TAIL_RE.search(name)
    return _TAILS[m.group(1)] if m else None


def _converter(conv: Callable[[object], float]) -> Callable[[float], float | None]:
    def convert(v: float) -> float | None:
        try:
            return conv(v)
        except ValueProblem:
            return None
    return convert


def match(name: str, labels: Labels) -> Match | Unmapped | None:
    if not (labels.get("subscription_name") or labels.get("source")):
        return None  # not gnmic's output
    hit = leaf_of(name)
    if hit is None:
        return Unmapped(Reason.UNMAPPED_METRIC, name)
    _path, rule = hit
    port_label = _label(rule.port)
    port = labels.get(port_label)
    if not port:
        return Unmapped(Reason.MISSING_LABEL, f"{name}: no {port_label!r} label")
    try:
        lane = int_label(labels, _label(rule.lane)) if rule.lane else None
        prio = int_label(labels, _label(rule.priority)) if rule.priority else None
    except ValueError as exc:
        return Unmapped(Reason.BAD_LABEL, f"{name}: {exc}")
    if rule.lane and lane is None:
        return Unmapped(Reason.MISSING_LABEL, f"{name}: no {_label(rule.lane)!r} label")
    return Match(rule.metric, DeviceKind.SWITCH, hosts_of(labels, "source", "target", instance=False),
                 (PortBy.NAME, port), lane=lane, priority=prio, value_fn=_converter(rule.conv))
