"""node_exporter -> catalogue: `node_network_*` (netdev, netclass), `node_ethtool_*`, `node_infiniband_*`.

Identity: node_exporter runs on the host, so `instance` names the device (a host); the `device`
label is a netdev (`eth0`: the inventory port of that name) or, for InfiniBand, an RDMA device
(`mlx5_0` with `port="1"`: the inventory port whose `nic` is mlx5_0).

node_network_* (kernel netdev counters) carry no RDMA traffic on a RoCE NIC, so they rank below
the ethtool physical-port counters (`rx_bytes_phy` & co.): where both exist for a port the
ethtool ones are kept and the netdev ones counted as `superseded`.

node_ethtool_*: node_exporter names each `ethtool -S` counter `node_ethtool_` + the name lowered,
non-alphanumerics as `_`, and `rx`/`tx` words spelt `received`/`transmitted` (rx_bytes_phy ->
node_ethtool_received_bytes_phy); its seven pre-declared ones end in `_total`. The original name
is recovered (each `received` word may have been `rx` or `received`; `port_`/`_nic` may have been
`port.`/`.nic`) and mapped by the host agent's own ethtool table (collectors/host/ethtool_stats.py),
with its ranks, units (pause durations in µs -> s), priorities and lanes. Per-queue counters
(`rx0_*`, `tx3_*`) have no port meaning and stay unmapped.

node_infiniband_* (sysfs PMA counters, through procfs): data counters are already bytes in
node_exporter (procfs multiplies the 4-octet words); error counters keep the PMA widths and
saturate, as in the host agent (collectors/host/rdma_sysfs.py).
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache

from collectors.host.ethtool_stats import match_stat
from service.telemetry.exporters.base import DeviceKind, Labels, Match, PortBy, Reason, Unmapped, hosts_of

EXPORTER = "node_exporter"
_H = DeviceKind.HOST

# metric -> (catalogue metric, rank, scale, blank-if-negative)
_NETWORK: dict[str, tuple[str, int, float]] = {
    "node_network_receive_bytes_total": ("port_rx_bytes_total", 6, 1.0),
    "node_network_transmit_bytes_total": ("port_tx_bytes_total", 6, 1.0),
    "node_network_receive_packets_total": ("port_rx_packets_total", 6, 1.0),
    "node_network_transmit_packets_total": ("port_tx_packets_total", 6, 1.0),
    "node_network_receive_errs_total": ("port_rx_errors_total", 6, 1.0),
    "node_network_transmit_errs_total": ("port_tx_errors_total", 6, 1.0),
    "node_network_receive_drop_total": ("port_rx_discards_total", 6, 1.0),
    "node_network_transmit_drop_total": ("port_tx_discards_total", 6, 1.0),
    "node_network_carrier_changes_total": ("port_carrier_changes_total", 0, 1.0),
    "node_network_up": ("port_oper_up", 0, 1.0),  # operstate == up
    "node_network_speed_bytes": ("port_speed_bits_per_second", 0, 8.0),  # bytes/s; -125000 when unknown
}

# node_infiniband_<name> -> (catalogue metric, counter bits, saturating)
_INFINIBAND: dict[str, tuple[str, int | None, bool]] = {
    "port_data_received_bytes_total": ("port_rx_bytes_total", None, False),
    "port_data_transmitted_bytes_total": ("port_tx_bytes_total", None, False),
    "port_packets_received_total": ("port_rx_packets_total", None, False),
    "port_packets_transmitted_total": ("port_tx_packets_total", None, False),
    "port_errors_received_total": ("port_rx_errors_total", 16, True),
    "port_discards_transmitted_total": ("port_tx_discards_total", 16, True),
    "symbol_error_total": ("port_symbol_errors_total", 16, True),
    "link_downed_total": ("port_link_down_events_total", 8, True),
    "link_error_recovery_total": ("port_link_error_recovery_total", 8, True),
    "port_transmit_wait_total": ("port_xmit_wait_ticks_total", 32, True),
}

_WORD_RE = re.compile(r"(?<![0-9a-z])(received|transmitted)(?![0-9a-z])")
_QUEUE_RE = re.compile(r"^(?:rx|tx|ch|xdp|xsk)\d+_")  # per-queue / per-channel counters (mlx5 rx0_*, virtio)


def _blank_negative(v: float) -> float | None:
    return None if v < 0 else v


@lru_cache(maxsize=4096)
def ethtool_stat(node_name: str) -> tuple[str, int, float, int | None, int | None] | None:
    """The host agent's mapping of the `ethtool -S` counter behind a node_ethtool_ metric name."""
    base = node_name.removeprefix("node_ethtool_")
    bases = [base, base.removesuffix("_total")] if base.endswith("_total") else [base]
    for b in bases:
        parts = _WORD_RE.split(b)  # words at odd positions
        choices = [[p] if i % 2 == 0 else [p, "rx" if p == "received" else "tx"] for i, p in enumerate(parts)]
        for combo in itertools.product(*choices):
            cand = "".join(combo)
            if _QUEUE_RE.match(cand):
                return None
            for c in (cand, re.sub(r"^port_", "port.", cand), re.sub(r"_nic$", ".nic", cand)):
                hit = match_stat(c)
                if hit is not None:
                    return hit
    return None


def match(name: str, labels: Labels) -> Match | Unmapped | None:
    if not name.startswith("node_"):
        return None
    if name.startswith("node_network_"):
        hit = _NETWORK.get(name)
        if hit is None:
            return Unmapped(Reason.UNMAPPED_METRIC, name)
        if not labels.get("device"):
            return Unmapped(Reason.MISSING_LABEL, f"{name}: no 'device' label")
        metric, rank, scale = hit
        return Match(metric, _H, hosts_of(labels), (PortBy.NAME, labels["device"]), rank=rank, scale=scale,
                     value_fn=_blank_negative if metric == "port_speed_bits_per_second" else None)
    if name.startswith("node_ethtool_"):
        stat = ethtool_stat(name)
        if stat is None:
            return Unmapped(Reason.UNMAPPED_METRIC, name)
        if not labels.get("device"):
            return Unmapped(Reason.MISSING_LABEL, f"{name}: no 'device' label")
        metric, rank, scale, prio, lane = stat
        # a name of one rank that several counters add up to (ucast + mcast + bcast) is a sum
        return Match(metric, _H, hosts_of(labels), (PortBy.NAME, labels["device"]), lane=lane, priority=prio,
                     scale=scale, rank=rank, component=name)
    if name.startswith("node_infiniband_"):
        ib = _INFINIBAND.get(name.removeprefix("node_infiniband_"))
        if ib is None:
            return Unmapped(Reason.UNMAPPED_METRIC, name)
        if not labels.get("device"):
            return Unmapped(Reason.MISSING_LABEL, f"{name}: no 'device' label")
        metric, bits, sat = ib
        return Match(metric, _H, hosts_of(labels), (PortBy.NIC, labels["device"], labels.get("port", "")),
                     counter_bits=bits, saturating=sat)
    return Unmapped(Reason.UNMAPPED_METRIC, name)  # node_cpu_*, node_memory_*: not fabric telemetry
