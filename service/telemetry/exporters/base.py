"""What an exporter mapping says about one series, before the inventory is consulted.

Each exporter module (node_exporter.py, dcgm_exporter.py, snmp_exporter.py, gnmic.py, native.py)
has a `match(name, labels)` that returns a `Match` (the catalogue metric, how to find the device
and the port, the entity labels, unit scale and rank) or an `Unmapped` (why not). The mapper
(mapper.py) then resolves identity against the inventory and assembles samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

Labels = Mapping[str, str]


class DeviceKind(StrEnum):
    """Which inventory kind an exporter runs on: breaks ties when several devices share an address."""

    HOST = "host"
    SWITCH = "switch"


class PortBy(StrEnum):
    """How an exporter names a port."""

    NAME = "name"  # the inventory's port name (a netdev on hosts, ifName / OpenConfig name on switches)
    NIC = "nic"  # an RDMA device (mlx5_0): the port whose `nic` it is, else a port of that name
    IFNAME = "ifname"  # SNMP: ifName, then ifDescr


# Why a series was not stored, as counted in reports and /metrics (docs/ecosystem.md lists them).
class Reason(StrEnum):
    UNMAPPED_METRIC = "unmapped_metric"  # no mapping for this metric name: not fabric telemetry
    MISSING_LABEL = "missing_label"  # a label the mapping needs (device, gpu, interface...) is absent
    BAD_LABEL = "bad_label"  # an entity label that must be an integer is not
    UNKNOWN_INSTANCE = "unknown_instance"  # no inventory device has this instance / hostname / source
    AMBIGUOUS_INSTANCE = "ambiguous_instance"  # several devices of the exporter's kind match it
    UNKNOWN_PORT = "unknown_port"  # the device is known, the port name is not
    BLANK_VALUE = "blank_value"  # a value the exporter uses for "no reading" (DCGM blanks)
    SUPERSEDED = "superseded"  # a better source of the same series exists (ethtool _phy over netdev)
    INCOMPLETE_SUM = "incomplete_sum"  # part of a summed metric arrived without the other parts
    NOT_FINITE = "not_finite"  # NaN or infinite (Prometheus staleness markers are NaN)


@dataclass(frozen=True, slots=True)
class Match:
    """A series that maps onto the catalogue; identity still to be resolved.

    `hosts`: label values naming the device, most specific first (dcgm-exporter's Hostname,
    gnmic's source, then Prometheus' instance). `port`: (how, value[, port number]) or None.
    `rank`: lower wins where two sources give one catalogue series (per port, remembered).
    `component`: set when several series add up to one catalogue series (the part's name).
    `value_fn`: a conversion that is not a plain scale (e.g. SNMP ifOperStatus 1/2 -> 1/0);
    returns None for a value that is no reading.
    """

    metric: str
    kind: DeviceKind | None  # None: no preference
    hosts: tuple[str, ...]
    port: tuple[PortBy, str] | tuple[PortBy, str, str] | None = None
    lane: int | None = None
    priority: int | None = None
    gpu: int | None = None
    scale: float = 1.0
    rank: int = 0
    component: str | None = None
    counter_bits: int | None = None
    saturating: bool = False
    value_fn: Callable[[float], float | None] | None = None
    exact: bool = False  # hosts are inventory device names (catalogue-named series), never addresses


@dataclass(frozen=True, slots=True)
class Unmapped:
    reason: Reason
    detail: str  # what is reported per reason: the metric name, or "name: why"


MatchFn = Callable[[str, Labels], "Match | Unmapped | None"]  # None: not this exporter's series


def hosts_of(labels: Labels, *names: str, instance: bool = True) -> tuple[str, ...]:
    """The non-empty values of these labels, in order, then `instance` (unless told not to)."""
    out = [labels[n] for n in names if labels.get(n)]
    if instance and labels.get("instance"):
        out.append(labels["instance"])
    return tuple(out)


def int_label(labels: Labels, name: str) -> int | None:
    """An integer entity label; ValueError if present and not a non-negative integer."""
    v = labels.get(name)
    if v is None or v == "":
        return None
    if not v.isdigit():
        raise ValueError(f"label {name}={v!r} is not a non-negative integer")
    return int(v)
